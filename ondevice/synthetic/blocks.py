"""Random GGUF blocks that decode to finite weights of a chosen spread: std(w) ≈ gain / √columns.

The quantized codes are random bytes; the scale fields are written here, so every block holds
finite fp16 scales of a sensible size and weights centred on zero (activations stay finite through
80 layers and an f16 KV cache). Layouts as in ggml-common.h (see quant/gguf_blocks.py):

  Q4_K  d, dmin | 8 six-bit (scale, min) pairs in 12 bytes | 4-bit q     w = d·sc·q − dmin·m
  Q5_K  the same with a 5th bit per weight (qh)
  Q6_K  ql | qh | int8 scales[16] | d                                      w = d·sc·(q − 32)
  Q8_0  d | int8 q[32]                                                     w = d·q
  Q5_0  d | qh | 4-bit q                                                   w = d·(q − 16)
  Q5_1  d, m | qh | 4-bit q                                                w = d·q + m

K-quants: sub-block scales sc are uniform in 4..15 and mins m = 4·sc, with dmin chosen so that
dmin·m = d·sc·E[q]: every sub-block is centred. Q6_K scales are uniform in 1..4; the types without
a min (Q6_K, Q8_0, Q5_0) get d of a random sign per block, as real quantizers produce, which
centres them too.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

K_SC = np.arange(4, 16)  # K-quant sub-block scales (6-bit field); mins are 4·sc ≤ 60
Q6_SC = np.arange(1, 5)


def _rms(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))


def _uniform_code_std(levels: int) -> float:
    return float(np.sqrt((levels**2 - 1) / 12))


def _f16(x: float | np.ndarray, n: int) -> np.ndarray:
    """x (a scalar or n values) as the 2 little-endian bytes of an fp16 each, (n, 2) uint8."""
    return np.broadcast_to(np.asarray(x, dtype="<f2"), (n,)).copy().view(np.uint8).reshape(n, 2)


def _signed(d: float, n: int, rng) -> np.ndarray:
    """±d at random per block: centres the types whose codes are not symmetric (q − 16 has mean −½)."""
    return d * (1.0 - 2.0 * rng.integers(0, 2, size=n))


def pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(n, 8) six-bit scales and mins → the (n, 12) bytes Q4_K/Q5_K store (get_scale_min_k4's inverse)."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return out


def _k_quant(raw: np.ndarray, rng, std: float, levels: int) -> None:
    """Q4_K (levels 16) / Q5_K (32): write d, dmin and the packed scales into random blocks."""
    n = raw.shape[0]
    d = std / (_rms(K_SC) * _uniform_code_std(levels))
    sc = rng.integers(K_SC[0], K_SC[-1] + 1, size=(n, 8), dtype=np.uint8)
    raw[:, 0:2] = _f16(d, n)
    raw[:, 2:4] = _f16(d * (levels - 1) / 2 / 4, n)  # dmin·4·sc = d·sc·E[q]
    raw[:, 4:16] = pack_k_scales(sc, 4 * sc)


def _q6_k(raw: np.ndarray, rng, std: float) -> None:
    n = raw.shape[0]
    raw[:, 192:208] = rng.integers(Q6_SC[0], Q6_SC[-1] + 1, size=(n, 16), dtype=np.uint8)
    raw[:, 208:210] = _f16(_signed(std / (_rms(Q6_SC) * _uniform_code_std(64)), n, rng), n)


def _q8_0(raw: np.ndarray, rng, std: float) -> None:
    raw[:, 0:2] = _f16(_signed(std / _uniform_code_std(256), raw.shape[0], rng), raw.shape[0])


def _q5_0(raw: np.ndarray, rng, std: float) -> None:
    raw[:, 0:2] = _f16(_signed(std / _uniform_code_std(32), raw.shape[0], rng), raw.shape[0])


def _q5_1(raw: np.ndarray, rng, std: float) -> None:
    d = std / _uniform_code_std(32)
    raw[:, 0:2] = _f16(d, raw.shape[0])
    raw[:, 2:4] = _f16(-15.5 * d, raw.shape[0])


_SCALES = {
    QT.Q4_K: lambda raw, rng, std: _k_quant(raw, rng, std, 16),
    QT.Q5_K: lambda raw, rng, std: _k_quant(raw, rng, std, 32),
    QT.Q6_K: _q6_k,
    QT.Q8_0: _q8_0,
    QT.Q5_0: _q5_0,
    QT.Q5_1: _q5_1,
}
SUPPORTED = frozenset(_SCALES) | {QT.F32, QT.F16}


def generator(*key: int) -> np.random.Generator:
    """A fast generator (SFC64: docs/measurements/code-notes.md) seeded by `key`."""
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence(list(key))))


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bytes as a writable uint8 array, straight from the bit generator."""
    return rng.bit_generator.random_raw(-(-n // 8)).view(np.uint8)[:n]


def random_blocks(qtype: QT, n_weights: int, rng: np.random.Generator, std: float) -> np.ndarray:
    """n_weights random weights of spread `std`, encoded as `qtype`: a 1-D uint8 array of its bytes.
    `rng` from `generator` (any numpy Generator works; SFC64 is what makes gigabytes fast)."""
    if qtype in (QT.F32, QT.F16):
        values = (std * rng.standard_normal(n_weights, dtype=np.float32)).astype(np.float32 if qtype == QT.F32 else np.float16)
        return values.view(np.uint8)
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype not in _SCALES or n_weights % block:
        raise ValueError(f"cannot write {n_weights} weights as {qtype.name}")
    raw = random_bytes(rng, n_weights // block * size).reshape(-1, size)
    _SCALES[qtype](raw, rng, std)
    return raw.reshape(-1)
