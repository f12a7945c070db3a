"""Quantized tiny models for tests: simple round-to-nearest encoders for the GGUF K-quants (gguf-py
has encoders for Q8_0/Q5_0/Q4_0 but not for K-quants), and a Q4_K_M-like mix of types.

The encoders are not llama.cpp's (no search for the best scales) but write valid blocks: what they
write is checked against gguf-py's own dequantizer (test_onnx.py). With hidden size 256 every
matrix can be a K-quant (256 weights per super-block).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT, quants

QUANT_DIMS = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """(rows, k) float → (rows, k/256·144) Q4_K blocks: w ≈ d·sc·q − dmin·m per sub-block of 32."""
    rows, k = w.shape
    x = w.reshape(-1, 8, 32).astype(np.float32)  # (blocks, sub-block, weight)
    lo = np.minimum(x.min(-1), 0.0)  # (blocks, 8) ≤ 0: the offsets are −lo
    step = np.maximum((x.max(-1) - lo) / 15, 1e-8)
    d = (step.max(-1) / 63).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.maximum(d[:, None], 1e-12)), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / np.maximum(dmin[:, None], 1e-12)), 0, 63).astype(np.uint8)
    scale, offset = d[:, None] * sc, dmin[:, None] * mn
    q = np.clip(np.round((x + offset[..., None]) / scale[..., None]), 0, 15).astype(np.uint8)  # (blocks, 8, 32)
    packed = np.zeros((len(x), 12), dtype=np.uint8)
    packed[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(len(x), 128)  # group g: sub-blocks 2g (low), 2g+1 (high)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, qs], axis=1)
    return blocks.reshape(rows, -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """(rows, k) float → (rows, k/256·210) Q6_K blocks: w ≈ d·sc·q per sub-block of 16, q ∈ [−32, 31]."""
    rows, k = w.shape
    x = w.reshape(-1, 16, 16).astype(np.float32)
    step = np.maximum(np.abs(x).max(-1) / 31, 1e-8)  # (blocks, 16)
    d = (step.max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / np.maximum(d[:, None], 1e-12)), 1, 127).astype(np.int8)
    q = np.clip(np.round(x / (d[:, None] * sc)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.reshape(len(x), 2, 4, 32).astype(np.uint8)  # (blocks, half, quarter, 32)
    ql = (q[:, :, 0:2] & 0x0F) | ((q[:, :, 2:4] & 0x0F) << 4)  # quarters 0,1 low nibbles; 2,3 high
    qh = sum(((q[:, :, s] >> 4) & 3) << (2 * s) for s in range(4))  # (blocks, half, 32)
    blocks = np.concatenate([ql.reshape(len(x), 128), qh.reshape(len(x), 64), sc.view(np.uint8), _f16_bytes(d)], axis=1)
    return blocks.reshape(rows, -1)


ENCODERS = {QT.Q4_K: quantize_q4_k, QT.Q6_K: quantize_q6_k}


def encode(w: np.ndarray, qtype: QT) -> np.ndarray:
    """(rows, k) float32 → (rows, bytes) GGUF blocks of qtype."""
    if qtype in ENCODERS:
        return ENCODERS[qtype](w)
    return quants.quantize(w.astype(np.float32), qtype)


def q4_k_m_mix(name: str, w: np.ndarray):
    """Like llama.cpp's Q4_K_M: Q4_K, with Q6_K for the head and every other layer's attn_v/ffn_down;
    the embedding Q5_0 and one matrix Q8_0 so the symmetric 8-bit path is covered too."""
    qtype = QT.Q4_K
    if name == "output.weight" or (name.endswith(("attn_v.weight", "ffn_down.weight")) and name.startswith("blk.1.")):
        qtype = QT.Q6_K
    elif name == "token_embd.weight":
        qtype = QT.Q5_0
    elif name == "blk.0.attn_k.weight":
        qtype = QT.Q8_0
    return encode(w, qtype), qtype
