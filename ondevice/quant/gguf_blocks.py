"""GGUF quantized blocks → float32, in torch, on whatever device the bytes are on.

A streamed layer can travel as its GGUF blocks (Q4_K is 4.5 bits/weight, Q6_K 6.56) and be
dequantized on the GPU after the transfer. The arithmetic mirrors `gguf.quants` (numpy) step by
step — same float32 operations in the same order, no fused multiply-add — so the result is
bit-identical to the model as loaded by gguf's numpy code, on CPU and on CUDA.

Block layouts (ggml-common.h), one row of `raw` is one block:
  Q8_0  (34 B / 32 w):  d:f16 | qs:int8[32]                      w = d·q
  Q5_0  (22 B / 32 w):  d:f16 | qh:u8[4] | qs:u8[16]              w = d·(q − 16), q = 5 bits
  Q4_0  (18 B / 32 w):  d:f16 | qs:u8[16]                         w = d·(q − 8)
  Q4_K (144 B / 256 w): d:f16 | dmin:f16 | scales:u8[12] | qs:u8[128]   w = d·sc·q − dmin·m
  Q5_K (176 B / 256 w): d:f16 | dmin:f16 | scales:u8[12] | qh:u8[32] | qs:u8[128]
  Q6_K (210 B / 256 w): ql:u8[128] | qh:u8[64] | scales:int8[16] | d:f16   w = d·sc·(q − 32)
"""

from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from ondevice.quant import gguf_triton

QK_K = 256


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 → (n, 1) float32 (little-endian f16)."""
    return raw.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """(n, g·width) uint8 → (n, g, 2, width): low nibbles of each run of `width` bytes, then high ones."""
    qs = qs.reshape(qs.shape[0], -1, 1, width)
    return (qs >> _shifts(0, 8, 4, qs.device).reshape(1, 1, 2, 1)) & 0x0F


def _shifts(start: int, stop: int, step: int, device: torch.device) -> torch.Tensor:
    """uint8 shift amounts made on the device (torch.tensor([...], device=cuda) would copy from
    pageable memory and make the CPU wait for the GPU: one stall per tensor of a streamed layer)."""
    return torch.arange(start, stop, step, dtype=torch.uint8, device=device)


def _bits(raw: torch.Tensor) -> torch.Tensor:
    """(n, b) uint8 → (n, 8·b) uint8 of 0/1, bit j of byte i at 8·i + j (a little-endian bitfield)."""
    return ((raw.unsqueeze(-1) >> _shifts(0, 8, 1, raw.device).reshape(1, 1, 8)) & 1).reshape(raw.shape[0], -1)


# --- integer parts: the codes and their scales, before any float arithmetic -------------------------
# Used to dequantize (below) and to hand the codes to integer kernels unchanged (onnx/nbits.py).
# Symmetric types give (q centred on 0 as int8, d); affine K-quants give (q unsigned, scale, offset).


def q8_0_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (n, 32), d (n, 1)): w = d·q."""
    return blocks[:, 2:].contiguous().view(torch.int8), _f16(blocks[:, :2])


def q4_0_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (n, 32) in [-8, 7], d (n, 1)): w = d·q."""
    return _nibbles(blocks[:, 2:], 16).reshape(blocks.shape[0], 32).to(torch.int8) - 8, _f16(blocks[:, :2])


def q5_0_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (n, 32) in [-16, 15], d (n, 1)): w = d·q."""
    n = blocks.shape[0]
    qh = _bits(blocks[:, 2:6])  # (n, 32): the 5th bit of every weight
    ql = _nibbles(blocks[:, 6:], 16).reshape(n, 32)
    return (ql | (qh << 4)).to(torch.int8) - 16, _f16(blocks[:, :2])


def q4_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 (n, 8, 32) in [0, 15], scale (n, 8, 1), offset (n, 8, 1)): w = scale·q − offset."""
    scale, offset = _k_affine(blocks)
    return _nibbles(blocks[:, 16:], 32).reshape(blocks.shape[0], -1, 32), scale, offset


def q5_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 (n, 8, 32) in [0, 31], scale (n, 8, 1), offset (n, 8, 1)): w = scale·q − offset."""
    n = blocks.shape[0]
    scale, offset = _k_affine(blocks)
    qh = blocks[:, 16:48].reshape(n, 1, 32)
    qh = (qh >> _shifts(0, 8, 1, blocks.device).reshape(1, 8, 1)) & 1  # (n, 8, 32): bit j of byte i is the 5th bit of weight 32·j + i
    ql = _nibbles(blocks[:, 48:], 32).reshape(n, -1, 32)
    return ql | (qh << 4), scale, offset


def q6_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (n, 16, 16) in [-32, 31], d (n, 16, 1)): w = d·q, d = super-block d × int8 scale."""
    n = blocks.shape[0]
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)  # (n, 16)
    d = (_f16(blocks[:, 208:210]) * scales).reshape(n, 16, 1)
    low = _nibbles(ql, 64).reshape(n, -1, 32)  # (n, 8, 32)
    high = ((qh.reshape(n, -1, 1, 32) >> _shifts(0, 8, 2, blocks.device).reshape(1, 1, 4, 1)) & 0x03).reshape(n, -1, 32)  # (n, 8, 32)
    return ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, -1), d


# --- dequantization: the same float32 operations, in the same order, as gguf.quants ---------------


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    q, d = q8_0_parts(blocks)
    return q.to(torch.float32) * d


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    q, d = q4_0_parts(blocks)
    return d * q.to(torch.float32)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    q, d = q5_0_parts(blocks)
    return d * q.to(torch.float32)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes → 8 six-bit scales and 8 six-bit mins, each (n, 8) uint8."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_affine(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: per sub-block scale d·sc and offset dmin·m, each (n, 8, 1) float32."""
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _k_scale_min(blocks[:, 4:16])
    scale = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    offset = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    return scale, offset


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    q, scale, offset = q4_k_parts(blocks)
    return (scale * q.to(torch.float32) - offset).reshape(blocks.shape[0], QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    q, scale, offset = q5_k_parts(blocks)
    return (scale * q.to(torch.float32) - offset).reshape(blocks.shape[0], QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    q, d = q6_k_parts(blocks)
    return (d * q.to(torch.float32)).reshape(blocks.shape[0], QK_K)


_BLOCK_DEQUANT = {
    QT.Q8_0: _q8_0,
    QT.Q4_0: _q4_0,
    QT.Q5_0: _q5_0,
    QT.Q4_K: _q4_k,
    QT.Q5_K: _q5_k,
    QT.Q6_K: _q6_k,
}
FLOAT_TYPES = {QT.F32: torch.float32, QT.F16: torch.float16, QT.BF16: torch.bfloat16}
SUPPORTED = frozenset(_BLOCK_DEQUANT) | frozenset(FLOAT_TYPES)


def byte_size(qtype: QT, shape: tuple[int, ...]) -> int:
    """Bytes of a GGUF tensor of this type and (numpy-order) shape."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    n = 1
    for dim in shape:
        n *= int(dim)
    if n % block:
        raise ValueError(f"{qtype.name} needs a multiple of {block} weights, got shape {shape}")
    return n // block * type_size


def dequantize(raw: torch.Tensor, qtype: QT | int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Raw GGUF tensor bytes (1-D uint8, on any device) → tensor of `shape` (numpy order, i.e.
    GGUF's dims reversed): float32 bit-identical to `gguf.quants.dequantize`, then cast to `dtype`.

    F32 as float32 comes back as a view of `raw` (no copy); everything else is freshly allocated.
    Q4_K, Q5_K, Q6_K and Q8_0 on a CUDA GPU go through one Triton kernel each (gguf_triton), same bits.
    """
    qtype = QT(qtype)
    if raw.dtype != torch.uint8 or raw.dim() != 1:
        raise ValueError("raw GGUF bytes must be a 1-D uint8 tensor")
    if raw.numel() != byte_size(qtype, shape):
        raise ValueError(f"{qtype.name} {tuple(shape)} needs {byte_size(qtype, shape)} bytes, got {raw.numel()}")
    if raw.storage_offset() % 4:  # float views of the bytes need aligned storage
        raw = raw.clone()
    if qtype in FLOAT_TYPES:
        return raw.view(FLOAT_TYPES[qtype]).reshape(shape).to(torch.float32).to(dtype)
    if qtype not in _BLOCK_DEQUANT:
        raise NotImplementedError(
            f"GGUF type {qtype.name} has no torch dequantizer (have: {sorted(t.name for t in SUPPORTED)})"
        )
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, type_size)  # (n_blocks, type_size)
    if gguf_triton.handles(qtype, raw.device):
        try:
            return gguf_triton.dequantize(blocks, qtype, dtype).reshape(shape)
        except Exception as error:  # noqa: BLE001 — any compile or launch failure: the torch path below
            gguf_triton.turn_off(error)
    return _BLOCK_DEQUANT[qtype](blocks).reshape(shape).to(dtype)


def fast_path_works(qtype: QT | int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the Triton kernel of `qtype` (gguf_triton) compiles and runs on `device`, with the torch
    path's bits on two random blocks: checked once per type and dtype, before a placement counts
    on it (offload/encoded.py). A failure turns the kernels off, as in use."""
    if not gguf_triton.handles(qtype, device):
        return False
    key = (int(qtype), str(device), dtype)
    if key not in _FAST_PATH_CHECKED:
        size, _ = gguf_triton.TYPES[int(qtype)]
        blocks = torch.randint(0, 256, (2, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        for at in {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (size - 2,)}.get(QT(int(qtype)), (0,)):  # f16 fields: finite
            blocks[:, at : at + 2] = torch.tensor([0.01, -0.02], dtype=torch.float16).view(torch.uint8).reshape(2, 2)
        try:
            ours = gguf_triton.dequantize(blocks.to(device), qtype, dtype).cpu()
        except Exception as error:  # noqa: BLE001 — any compile or launch failure
            gguf_triton.turn_off(error)
            return False
        reference = _BLOCK_DEQUANT[QT(int(qtype))](blocks).reshape(-1).to(dtype)
        _FAST_PATH_CHECKED[key] = torch.equal(ours.view(torch.uint8), reference.view(torch.uint8))
    return _FAST_PATH_CHECKED[key]


_FAST_PATH_CHECKED: dict[tuple, bool] = {}
