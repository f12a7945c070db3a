"""GGUF weight blocks → the inputs of ONNX Runtime's `com.microsoft.MatMulNBits`, codes unchanged.

MatMulNBits computes y = x·Wᵀ with W (N out, K in) stored as `bits`-bit codes in blocks of
`block` along K, one float scale per block and (here) no zero-point input, i.e. the kernel's
default zero point 2^(bits−1): w = scale·(code − 2^(bits−1)). That symmetric form is what the
fast integer kernels take; a float zero point sends the node to a dequantize-everything fallback
(`onnx/session.py`). So:

  Q4_0  w = d·q, q ∈ [−8, 7]           → 4-bit, block 32, code q + 8               (exact)
  Q5_0  w = d·q, q ∈ [−16, 15]         → 8-bit, block 32, code q + 128             (exact)
  Q8_0  w = d·q, q ∈ [−128, 127]       → 8-bit, block 32, code q + 128             (exact)
  Q6_K  w = d·sc·q, q ∈ [−32, 31]      → 8-bit, block 16, code q + 128, scale d·sc (exact)
  Q4_K  w = s·q − o, q ∈ [0, 15]       → 4-bit, block 32, code q, scale s, plus a correction
  Q5_K  w = s·q − o, q ∈ [0, 31]       → 8-bit, block 32, code q + 112, scale s, plus a correction

K-quants are affine: each sub-block of 32 has its own offset o (Q4_K's "min"). With the codes kept
as they are, w = s·(q − z) + (z·s − o) for the kernel's zero point z, so

    y[t, n] = MatMulNBits(x)[t, n] + Σ_j xsum[t, j] · c[n, j],   c = z·s − o,  xsum = Σ_{k∈j} x[t, k]

a dense product over K/32 block sums: 1/32 of the work. `NBitsWeight.correction` holds c (N, K/32).
Every float above is computed in float32 exactly as gguf's dequantizer does (scales d·sc and s are
exact products of an f16 and a small integer), so the mapping loses nothing; what differs from
the float model is the kernel's arithmetic (int8 activations at accuracy level 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from ondevice.quant import gguf_blocks as gb

CORRECTION_GROUP = 32  # K-quant sub-block: one offset per 32 weights

# qtype -> (bits, block): how each GGUF type maps (see the table above)
NBITS_LAYOUT = {QT.Q4_0: (4, 32), QT.Q5_0: (8, 32), QT.Q8_0: (8, 32), QT.Q6_K: (8, 16), QT.Q4_K: (4, 32), QT.Q5_K: (8, 32)}
FLOAT_QTYPES = frozenset(gb.FLOAT_TYPES)  # stored as plain float matrices instead


@dataclass
class NBitsWeight:
    """One weight matrix W (n out, k in) as MatMulNBits initializers."""

    n: int
    k: int
    bits: int
    block: int
    codes: np.ndarray  # (n, k / block, block·bits / 8) uint8; 4-bit: element 2i in the low nibble
    scales: np.ndarray  # (n, k / block) float32
    correction: np.ndarray | None = None  # (n, k / 32) float32: c above, None for symmetric types

    def dequantize(self) -> np.ndarray:
        """(n, k) float32 W as the kernel sees it (codes, scales and correction): for tests."""
        zero = 1 << (self.bits - 1)
        codes = unpack_codes(self.codes, self.bits).astype(np.float32) - zero  # (n, nb, block)
        w = (codes * self.scales[..., None]).reshape(self.n, self.k)
        if self.correction is not None:
            w = w + np.repeat(self.correction, CORRECTION_GROUP, axis=1)
        return w


def supported(qtype: QT | int) -> bool:
    return QT(qtype) in NBITS_LAYOUT


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """(..., block) uint8 codes → (..., block·bits/8) bytes; 4-bit: pairs, first in the low nibble."""
    if bits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return packed
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2], out[..., 1::2] = packed & 0x0F, packed >> 4
    return out


def gguf_to_nbits(raw: np.ndarray, qtype: QT | int, n: int, k: int, rows: np.ndarray | None = None) -> NBitsWeight:
    """A GGUF tensor's bytes (W is n rows of k weights) → MatMulNBits inputs; `rows`: keep only these
    rows of W, in this order (a VocabTrim head: quantized rows are independent, sliced untouched)."""
    qtype = QT(qtype)
    if qtype not in NBITS_LAYOUT:
        raise ValueError(f"{qtype.name} has no MatMulNBits mapping (have {', '.join(t.name for t in NBITS_LAYOUT)})")
    elems, type_size = GGML_QUANT_SIZES[qtype]
    by_row = np.asarray(raw, dtype=np.uint8).reshape(n, k // elems * type_size)
    if rows is not None:
        by_row, n = by_row[rows], len(rows)
    blocks = torch.from_numpy(np.ascontiguousarray(by_row)).reshape(-1, type_size)  # (n·k/elems, type_size)
    bits, block = NBITS_LAYOUT[qtype]
    zero = 1 << (bits - 1)
    correction = None
    if qtype in (QT.Q4_K, QT.Q5_K):
        q, scale, offset = (gb.q4_k_parts if qtype == QT.Q4_K else gb.q5_k_parts)(blocks)
        codes = q.to(torch.int16) + (zero - 16 if qtype == QT.Q5_K else 0)  # Q5_K: q − 16 is centred
        z = 16.0 if qtype == QT.Q5_K else float(zero)
        correction = (z * scale - offset).reshape(n, k // CORRECTION_GROUP).numpy()
    else:
        parts = {QT.Q4_0: gb.q4_0_parts, QT.Q5_0: gb.q5_0_parts, QT.Q8_0: gb.q8_0_parts, QT.Q6_K: gb.q6_k_parts}[qtype]
        q, scale = parts(blocks)
        codes = q.to(torch.int16) + zero
    codes = codes.to(torch.uint8).reshape(n, k // block, block).numpy()
    return NBitsWeight(n, k, bits, block, pack_codes(codes, bits), scale.reshape(n, k // block).numpy().astype(np.float32), correction)


def stack_rows(parts: list[NBitsWeight]) -> NBitsWeight | None:
    """W₁, W₂, … (same k, bits and block) as one matrix of their rows, in order; None if they differ.
    A missing correction is zeros (a symmetric part beside a K-quant one)."""
    first = parts[0]
    if any((p.k, p.bits, p.block) != (first.k, first.bits, first.block) for p in parts):
        return None
    correction = None
    if any(p.correction is not None for p in parts):
        group = first.k // CORRECTION_GROUP
        correction = np.concatenate([p.correction if p.correction is not None else np.zeros((p.n, group), np.float32) for p in parts])
    return NBitsWeight(sum(p.n for p in parts), first.k, first.bits, first.block, np.concatenate([p.codes for p in parts]),
                       np.concatenate([p.scales for p in parts]), correction)  # fmt: skip


def requantize_4bit(w: NBitsWeight, block: int = 32) -> NBitsWeight:
    """A 4-bit copy (symmetric, `block` weights per scale) of a matrix, by llama.cpp's Q4_0 rule: in
    each block the weight of largest magnitude maps to code 0 (−8·d). Not exact: for a drafter, whose
    proposals the target checks anyway. Fewer bytes per weight than the exact mapping (block 32:
    0.5 B of codes + 4 B of scale per 32 weights, no K-quant correction), bigger blocks fewer still."""
    x = w.dequantize().reshape(w.n, w.k // block, block)
    extreme = np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], axis=-1)  # (n, blocks, 1), signed
    d = extreme / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    codes = np.clip(np.trunc(x * inv + 8.5), 0, 15).astype(np.uint8)
    return NBitsWeight(w.n, w.k, 4, block, pack_codes(codes, 4), d.reshape(w.n, -1).astype(np.float32))
