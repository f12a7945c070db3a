"""What a drafter needs to run a VocabTrim drafter (see ondevice/vocabtrim/build.py).

The trimmed GGUF knows only K tokens, but the drafter must accept any target token as input and
propose target ids. So:

- inputs go in as embeddings (`llama_batch.embd`; a LlamaContext made with embeddings_input=True),
  the *original* drafter's token_embd rows, dequantized here from the full drafter file
  (memory-mapped, only the rows asked for), so they are the very values llama.cpp looks up;
- outputs are (n, K) logits: draft index i is target id `keep_ids[i]` (`to_target_ids`,
  `to_target_probs`).

`TrimmedContext` wraps such a context so that it takes target ids like the full drafter's and
returns the K columns; the drafter's search ranks those K columns alone (a log-softmax and top-k
over K instead of the whole vocabulary) and maps what it keeps to target ids through the head
(the `columns` of a draft Expander).

Never tokenize with the trimmed file; the target's tokenizer gives the ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.llama_backend import LlamaContext
from ondevice.files.embedding_rows import EmbeddingRows
from ondevice.vocabtrim.build import TrimmedVocab, find_trimmed, trimmed_paths


class KeptColumns:
    """The K columns of a trimmed head's logits: draft index i ↔ target id keep_ids[i] (ascending),
    every other id of the n_vocab_full has probability 0 (draft/builders.Columns)."""

    def __init__(self, keep_ids, n_vocab_full: int):
        self.keep_ids = np.asarray(keep_ids, dtype=np.int64)
        self.n_vocab_full = n_vocab_full

    def to_target_ids(self, draft_ids) -> np.ndarray:
        """Draft indices (anything integer-shaped) → target token ids, same shape."""
        return self.keep_ids[np.asarray(draft_ids, dtype=np.int64)]

    def to_target_probs(self, probs: np.ndarray) -> np.ndarray:
        """(..., K) draft probabilities → (..., n_vocab_full), zero outside keep_ids."""
        full = np.zeros(probs.shape[:-1] + (self.n_vocab_full,), dtype=probs.dtype)
        full[..., self.keep_ids] = probs
        return full


class TrimmedHead(KeptColumns):
    """A trimmed drafter's vocabulary map (KeptColumns) and input embeddings.

    gguf_path: the trimmed GGUF to load in llama.cpp (its n_vocab is `n_vocab`).
    """

    def __init__(self, drafter: str | Path):
        drafter = Path(drafter)
        trimmed = find_trimmed(drafter)
        if trimmed is None:
            raise OndeviceError(f"no trimmed vocabulary is built for {drafter.name}; run `ondevice quant vocab-trim`")
        record = TrimmedVocab.load(trimmed_paths(drafter)[1])
        super().__init__(record.keep_ids, record.n_vocab)  # the target's vocabulary
        self.gguf_path = trimmed
        self.n_vocab = record.k  # the trimmed (draft) vocabulary
        self.n_embd = record.n_embd
        self._embedding = EmbeddingRows(  # the full drafter's token_embd rows, read as asked
            str(drafter), record.embd_offset, record.embd_type, record.embd_rows, record.embd_row_bytes, record.n_embd
        )

    @classmethod
    def find(cls, drafter: str | Path) -> "TrimmedHead | None":
        """The trimmed head built for this drafter, or None if none was built."""
        return cls(drafter) if find_trimmed(drafter) is not None else None

    def embed(self, token_ids) -> np.ndarray:
        """(n, n_embd) float32 input embeddings of target token ids (the full drafter's token_embd rows)."""
        return self._embedding(token_ids)




class TrimmedContext:
    """A LlamaContext over the trimmed GGUF that takes target token ids like one over the full drafter.

    `decode` takes target token ids, feeds their embeddings, and returns the (n_outputs, K) logits
    of the kept tokens (column i is target id head.keep_ids[i]; every other token has probability
    0). Everything else (seq_rm, seq_cp, n_batch, ...) is the wrapped context's. The ctx must be
    made with embeddings_input=True over head.gguf_path.
    """

    def __init__(self, ctx: LlamaContext, head: TrimmedHead):
        if ctx.n_vocab != head.n_vocab:
            raise ValueError(f"the context has {ctx.n_vocab} tokens, the trimmed head {head.n_vocab}")
        self.ctx = ctx
        self.head = head
        self.n_vocab = head.n_vocab_full  # the ids it takes

    def decode(self, tokens, positions, seq_ids, outputs) -> np.ndarray:
        """As LlamaContext.decode, with (n_outputs, K) logits: a view valid until the next decode."""
        return self.ctx.decode(None, positions, seq_ids, outputs, embeddings=self.head.embed(tokens))

    def __getattr__(self, name):
        if name == "ctx":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.ctx, name)
