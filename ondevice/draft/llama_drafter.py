"""LlamaDrafter: a small GGUF model on the CPU (llama.cpp) that proposes draft trees.

It keeps its own KV cache across rounds (`DraftKV`): each `draft(context, spec)` keeps what is
cached of `context` (the accepted nodes of the last tree included), decodes only the new tokens,
then grows a tree with the builder named in `spec` (see `ondevice.draft.builders`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ondevice.draft.builders import BATCH_SPREAD, Round, build_best_first, build_chain, build_multi_seq
from ondevice.draft.search_tree import SearchTree
from ondevice.draft.tree_cache import DraftKV
from ondevice.draft.trimmed_input import TrimmedContext, TrimmedHead
from ondevice.errors import OndeviceError
from ondevice.llama_backend import LLAMA_MAX_SEQUENCES, LlamaContext, LlamaModel
from ondevice.protocols import MAX_BUDGET, MODEL_BUILDERS, DraftSpec
from ondevice.tree import DraftTree


def check_spec(spec: DraftSpec) -> None:
    if spec.builder not in MODEL_BUILDERS:
        raise OndeviceError(f"the drafter model builds {', '.join(MODEL_BUILDERS)} trees, not {spec.builder!r}.")
    if not 1 <= spec.budget <= MAX_BUDGET:
        raise OndeviceError(f"the draft budget must be 1 to {MAX_BUDGET} tokens, not {spec.budget}.")
    if spec.max_depth is not None and spec.max_depth < 1:
        raise OndeviceError(f"the draft depth must be at least 1, not {spec.max_depth}.")
    if not spec.temperature >= 0:
        raise OndeviceError(f"the temperature must be >= 0, not {spec.temperature}.")


class LlamaDrafter:
    """Drafter protocol over llama.cpp; n_ctx is the longest context it must hold (tree cells come on top).

    vocab_trim: use the VocabTrim head built for this drafter (`ondevice quant vocab-trim`) if there is
    one: target ids in, full-vocabulary distributions out, zero outside the kept tokens.
    target_vocab: the target's vocabulary size when the two differ by padding (tokenizer.vocab_mismatch):
    ids the target lacks are never drafted, and a context holding an id the drafter lacks gets no draft.
    """

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 4096,
        threads: int | None = None,
        max_batch: int = 64,
        batch_spread: float = BATCH_SPREAD,
        kv_type: str = "f32",
        n_batch: int = 512,
        vocab_trim: bool = False,
        target_vocab: int | None = None,
    ):
        if not 1 <= max_batch < LLAMA_MAX_SEQUENCES:
            raise OndeviceError(f"max_batch must be 1 to {LLAMA_MAX_SEQUENCES - 1}, not {max_batch}.")
        head = TrimmedHead.find(model_path) if vocab_trim else None
        self.model = LlamaModel(head.gguf_path if head else model_path)
        llama_ctx = LlamaContext(
            self.model,
            n_ctx=n_ctx + MAX_BUDGET + max_batch,
            n_batch=n_batch,
            threads=threads,
            kv_type=kv_type,
            embeddings_input=head is not None,
        )
        self.ctx = TrimmedContext(llama_ctx, head) if head else llama_ctx
        self.vocab_trimmed = head is not None
        self.n_ctx = n_ctx
        self.n_vocab = self.ctx.n_vocab
        self.max_batch = max_batch
        self.batch_spread = batch_spread
        self.cache = DraftKV(self.ctx)
        limit = target_vocab if target_vocab is not None and target_vocab < self.n_vocab else None
        self.expander = self.cache if limit is None else _VocabLimit(self.cache, limit)

    def draft(self, context: Sequence[int], spec: DraftSpec) -> DraftTree:
        check_spec(spec)
        if not 0 < len(context) <= self.n_ctx:
            raise OndeviceError(
                f"the drafter holds 1 to {self.n_ctx} context tokens, got {len(context)}; "
                "start a new chat or raise the context size."
            )
        if max(context) >= self.n_vocab:  # the target committed an id the drafter has no row for
            return DraftTree.root_only(int(context[-1]))
        root_logits = self.cache.sync(context)
        if self.expander is not self.cache:
            root_logits = self.expander.mask(root_logits)
        r = Round(spec, int(context[-1]), self.expander, position=len(context))
        root_logp = r.distributions([0], root_logits[None, :])[0]
        if spec.builder == "chain":
            return build_chain(r, root_logp)
        if spec.builder == "multi-seq":
            return build_multi_seq(r, root_logp)
        return build_best_first(r, root_logp, self.max_batch, self.batch_spread)

    def probe_batch(self, n: int) -> None:
        """One llama_decode of n draft nodes (siblings, each on its own branch), then undone. For profiling."""
        stand_in = (np.arange(64 + n) * 7919 + 11) % self.n_vocab  # arbitrary valid token ids
        if not self.cache.tokens:
            self.cache.sync(stand_in[:64].tolist())  # a 64-token context
        search = SearchTree(self.cache.tokens[-1])
        nodes = search.add_children(0, stand_in[64:], np.zeros(n))
        self.cache.expand(search, nodes)
        self.cache.release(search, {0})

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


class _VocabLimit:
    """The drafter's KV cache as an Expander whose logits are -inf from id `limit` on: a drafter
    with a longer (padded) vocabulary than the target's never proposes an id the target lacks."""

    def __init__(self, cache: DraftKV, limit: int):
        self.cache, self.limit = cache, limit

    def mask(self, logits: np.ndarray) -> np.ndarray:
        logits = np.array(logits, dtype=np.float32, copy=True)
        logits[..., self.limit :] = -np.inf
        return logits

    def expand(self, tree: SearchTree, nodes: Sequence[int]) -> np.ndarray:
        return self.mask(self.cache.expand(tree, nodes))

    def free_capacity(self) -> int:
        return self.cache.free_capacity()

    def release(self, tree: SearchTree, alive: set[int]) -> None:
        self.cache.release(tree, alive)
