"""LlamaDrafter: a small GGUF model on the CPU (llama.cpp) that proposes draft trees.

It keeps its own KV cache across rounds (`DraftKV`): each `draft(context, spec)` keeps what is
cached of `context` (the accepted nodes of the last tree included), decodes only the new tokens,
then grows a tree with the builder named in `spec` (`model_drafter.ModelDrafter`, `builders`).
"""

from __future__ import annotations

from pathlib import Path

from ondevice.draft.builders import BATCH_SPREAD, LEAF_MARGIN
from ondevice.draft.held_weights import let_go, loads_mapped
from ondevice.draft.model_drafter import ModelDrafter
from ondevice.draft.requantized import drafter_weights
from ondevice.draft.tree_cache import DraftKV
from ondevice.vocabtrim.head import TrimmedContext, TrimmedHead
from ondevice.errors import OndeviceError
from ondevice.llama_backend import LLAMA_MAX_SEQUENCES, LlamaContext, LlamaModel
from ondevice.decode.protocols import MAX_BUDGET


class LlamaDrafter(ModelDrafter):
    """Drafter protocol over llama.cpp; n_ctx is the longest context it must hold (tree cells come on top).

    vocab_trim: use the VocabTrim head built for this drafter (`ondevice quant vocab-trim`) if there is
    one: target ids in, logits of the kept tokens out (every other token has probability 0). The file
    loaded is the requantized copy where one was written for it (draft/requantized.py).
    target_vocab: the target's vocabulary size when the two differ by padding (tokenizer.vocab_mismatch):
    ids the target lacks are never drafted, and a context holding an id the drafter lacks gets no draft.
    max_tree: the biggest tree it will be asked for (its KV cells, sequences and logits rows are
    sized for it: `ondevice.loading.memory`). resident: held beside a streaming target: weights read
    into anonymous memory rather than mapped, so the target's reads cannot evict them; or, where
    llama.cpp repacks nearly all of them, mapped and the file's pages let go once loaded (its repacked
    copies are anonymous memory, and an input table it does not read is not held: draft/held_weights.py).
    """

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 4096,
        threads: int | None = None,
        max_batch: int = 64,
        batch_spread: float = BATCH_SPREAD,
        leaf_margin: float = LEAF_MARGIN,
        kv_type: str = "f32",
        n_batch: int = 512,
        vocab_trim: bool = False,
        target_vocab: int | None = None,
        max_tree: int = MAX_BUDGET,
        resident: bool = False,
    ):
        if not 1 <= max_batch < LLAMA_MAX_SEQUENCES:
            raise OndeviceError(f"max_batch must be 1 to {LLAMA_MAX_SEQUENCES - 1}, not {max_batch}.")
        head = TrimmedHead.find(model_path) if vocab_trim else None
        weights = drafter_weights(head.gguf_path if head else model_path)
        mapped = resident and loads_mapped(weights)
        self.model = LlamaModel(weights, resident=resident and not mapped, vocab=False)  # drafts ids: the tokenizer is the target's
        if mapped:
            let_go(weights)
        llama_ctx = LlamaContext(
            self.model,
            n_ctx=n_ctx + max_tree + max_batch,
            n_seq_max=min(LLAMA_MAX_SEQUENCES, max_tree + 1),  # one per expanded branch, and the context
            n_batch=n_batch,
            threads=threads,
            kv_type=kv_type,
            embeddings_input=head is not None,
            n_outputs_max=max_batch,
        )
        self.ctx = TrimmedContext(llama_ctx, head) if head else llama_ctx
        self.vocab_trimmed = head is not None
        self.n_ctx = n_ctx
        self.n_vocab = self.ctx.n_vocab
        self.max_batch = max_batch
        self.max_tree = max_tree
        self.batch_spread = batch_spread
        self.leaf_margin = leaf_margin
        self.cache = DraftKV(self.ctx, columns=head)
        self.limit_vocab(target_vocab)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

