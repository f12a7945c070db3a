"""OnnxTarget: the `ondevice.decode.protocols.Target` on ONNX Runtime (CPU), from the GGUF's own weights.

The decoder is our model exported once (`ondevice.onnx.export`, cached next to the GGUF) with its
matrices in MatMulNBits, whose integer GEMM reuses each weight block across all the tokens of a
pass: a tree of 8 costs far less than 8 single-token passes, where llama.cpp's CPU cost grows about
linearly. Slots and positions work as in TorchTarget: committed tokens fill slots 0..n_cached; a
tree's nodes sit provisionally at n_cached + node index, RoPE position n_cached + depth, attending
to the cache and their ancestors; `commit(path)` moves the path's entries down (no recompute).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ondevice.decode.kvcache import TreeSlots
from ondevice.decode.protocols import Target
from ondevice.onnx.decoder import OnnxDecoder, causal_mask
from ondevice.onnx.export import ACCURACY_INT8, ensure_export
from ondevice.decode.tree import DraftTree

PREFILL_CHUNK = 256  # tokens per prefill pass (bounds the attention bias and activations)


class OnnxTarget(Target):
    def __init__(self, decoder: OnnxDecoder, n_ctx: int):
        self.decoder = decoder
        self.n_vocab = decoder.args.vocab_size
        self.n_ctx = n_ctx
        self.slots = TreeSlots(n_ctx)

    @classmethod
    def from_gguf(cls, path: str | Path, n_ctx: int = 4096, threads: int | None = None, accuracy_level: int = ACCURACY_INT8,
                  show: bool = True) -> "OnnxTarget":  # fmt: skip
        """Export the GGUF to ONNX on first use (cached beside it), then open it with n_ctx cache slots."""
        export = ensure_export(path, accuracy_level=accuracy_level, show=show)
        return cls(OnnxDecoder(export, slots=n_ctx, threads=threads), n_ctx)

    @property
    def n_cached(self) -> int:
        return self.slots.n_cached

    def truncate(self, n_tokens: int) -> None:
        self.slots.truncate(n_tokens)

    def prefill(self, tokens: Sequence[int]) -> None:
        self.slots.check_room(len(tokens))
        for i in range(0, len(tokens), PREFILL_CHUNK):
            chunk = list(tokens[i : i + PREFILL_CHUNK])
            start = self.slots.n_cached
            self.decoder.hidden(chunk, np.arange(start, start + len(chunk)), start, causal_mask(start, len(chunk)))
            self.slots.appended(len(chunk))

    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        n, start = len(tree), self.slots.n_cached
        self.slots.check_room(n)
        mask = np.concatenate([np.ones((n, start), dtype=bool), tree.ancestor_mask()], axis=1)  # (n, start + n)
        logits = self.decoder.forward(tree.tokens, start + tree.depths, start, mask)
        self.slots.tree_written(tree.parents)
        return logits

    def commit(self, path: Sequence[int]) -> None:
        self.slots.commit(path, self.decoder.move)

    def placement_summary(self) -> str:
        return f"{self.decoder.args.n_layers} layers on CPU (ONNX Runtime, MatMulNBits)"

    def close(self) -> None:
        self.decoder.close()
