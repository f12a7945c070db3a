"""Run an exported decoder (body + head sessions) over a KV cache that stays where it is.

The cache is one pair of numpy arrays per layer, (1, nkv, slots, hd) float32, bound through ORT's
I/O binding as both `past_*` and `present_*` of the body: GroupQueryAttention reads the first
S − T slots and writes the T new entries in place. Nothing is copied in or out per call; moving
entries (keeping a tree's accepted path) is a numpy copy within the arrays.

A call: tokens at cache slots start..start+T−1, RoPE positions of the caller's choice, and a
boolean mask (T, start+T) saying which slots each token may attend to. The caller (target or
drafter) decides what lives in which slot.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnxruntime as ort
import torch

from ondevice.decode.kvcache import move_entries
from ondevice.onnx.export import OnnxExport
from ondevice.onnx.session import open_session
from ondevice.targets.torch_model import rope_angles, rope_inv_freq


class OnnxDecoder:
    """An export's body and head over `slots` cache entries per layer.

    trimmed: use the export's trimmed head (logits for its rows only) instead of the full one.
    """

    def __init__(self, export: OnnxExport, slots: int, threads: int | None = None, trimmed: bool = False):
        args = export.args
        self.args, self.slots, self.embedding = args, slots, export.embedding
        self.body = open_session(export.body, threads)
        self.head = open_session(export.trimmed_head if trimmed else export.head, threads)
        self.inv_freq = rope_inv_freq(args)
        shape = (1, args.n_kv_heads, slots, args.head_dim)
        self.keys = [np.zeros(shape, dtype=np.float32) for _ in range(args.n_layers)]
        self.values = [np.zeros(shape, dtype=np.float32) for _ in range(args.n_layers)]
        self.binding = self.body.io_binding()
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            k_value, v_value = ort.OrtValue.ortvalue_from_numpy(k), ort.OrtValue.ortvalue_from_numpy(v)
            self.binding.bind_ortvalue_input(f"past_key_{i}", k_value)
            self.binding.bind_ortvalue_output(f"present_key_{i}", k_value)
            self.binding.bind_ortvalue_input(f"past_value_{i}", v_value)
            self.binding.bind_ortvalue_output(f"present_value_{i}", v_value)

    def hidden(self, tokens: Sequence[int], positions: np.ndarray, start: int, mask: np.ndarray) -> np.ndarray:
        """Final-normed hidden states (T, C) of `tokens`, whose keys and values land at slots start..start+T−1.

        positions (T,) int: RoPE positions; mask (T, start + T) bool: which slots each token sees.
        """
        n = len(tokens)
        if start + n > self.slots:
            raise ValueError(f"slots {start}..{start + n} exceed the cache of {self.slots}")
        cos, sin = rope_angles(self.inv_freq, torch.as_tensor(np.asarray(positions, dtype=np.int64))[None])
        half = self.args.head_dim // 2
        feeds = {
            "embeds": self.embedding(tokens)[None],
            "cos": np.ascontiguousarray(cos[0, 0, :, :half].numpy()),
            "sin": np.ascontiguousarray(sin[0, 0, :, :half].numpy()),
            "rope_ids": np.arange(n, dtype=np.int64)[None],
            "seqlens_k": np.array([start + n - 1], dtype=np.int32),
            "total_len": np.array(start + n, dtype=np.int32),
            "attention_bias": np.where(mask, np.float32(0), np.float32(-np.inf))[None, None].astype(np.float32),
        }
        for name, array in feeds.items():
            self.binding.bind_cpu_input(name, array)
        hidden = np.empty((1, n, self.args.dim), dtype=np.float32)
        self.binding.bind_output("hidden", "cpu", 0, np.float32, hidden.shape, hidden.ctypes.data)
        self.body.run_with_iobinding(self.binding)
        return hidden[0]

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(T, C) hidden states → (T, rows of the head) float32 logits."""
        return self.head.run(["logits"], {"hidden": hidden[None]})[0][0]

    def forward(self, tokens: Sequence[int], positions: np.ndarray, start: int, mask: np.ndarray) -> np.ndarray:
        return self.logits(self.hidden(tokens, positions, start, mask))

    def close(self) -> None:
        """Release the sessions and the cache arrays (idempotent)."""
        self.binding = self.body = self.head = None
        self.keys, self.values = [], []

    def move(self, src_slots: np.ndarray, dst_start: int) -> None:
        """In every layer, copy the entries at src_slots to dst_start, dst_start+1, … (gathered first)."""
        move_entries((*self.keys, *self.values), np.asarray(src_slots, dtype=np.int64), dst_start)


def causal_mask(start: int, n: int) -> np.ndarray:
    """(n, start + n): every cached slot, then the new tokens causally."""
    return np.concatenate([np.ones((n, start), dtype=bool), np.tri(n, dtype=bool)], axis=1)

