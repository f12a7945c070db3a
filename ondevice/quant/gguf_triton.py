"""Q4_K, Q5_K, Q6_K and Q8_0 blocks → weights on a CUDA GPU, one Triton kernel per tensor.

A layer streamed to the GPU is dequantized on every pass (so is one kept encoded on the device:
offload/encoded.py). `gguf_blocks` does it in about ten elementwise torch passes over the layer's
weights, slower on an H100 than copying the layer in: a streamed pass would run at half the
pinned bandwidth (docs/measurements/2026-11-27-gpu-h100.md). These kernels read each block once
and write each weight once, in the dtype the model computes in.

The arithmetic is gguf_blocks' (and gguf.quants'): the same float32 operations in the same
order, with no fused multiply-add (`enable_fp_fusion=False`), rounded once to the output dtype
— bit-identical to `gguf_blocks.dequantize(...).to(dtype)` (tests/test_quant.py checks it on a
GPU, and on a CPU in Triton's interpreter where Triton is installed).

Block layouts (as gguf_blocks' docstring), byte offsets within one block:
  Q4_K (144 B): d f16 @0 | dmin f16 @2 | scales @4..15 | qs @16..143
      weight p: sub-block j = p // 32, its nibble (j % 2) of byte 16 + 32·(j // 2) + p % 32
  Q5_K (176 B): as Q4_K with qh @16..47 before qs @48..175; the 5th bit of weight p is bit j of
      qh[p % 32]
  Q6_K (210 B): ql @0..127 | qh @128..191 | scales int8 @192..207 | d f16 @208
      weight p (h = p // 128, r = p % 128): low nibble (r // 64) of ql[64h + r % 64],
      2 high bits (r // 32) of qh[32h + r % 32], scale p // 16
  Q8_0 (34 B, 32 weights): d f16 @0 | qs int8 @2..33
"""

from __future__ import annotations

import os
import warnings

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # torch's CPU builds come without Triton: gguf_blocks' torch path then
    triton = None

WEIGHTS_PER_PROGRAM = 2048
TYPES = {8: (34, 32), 12: (144, 256), 13: (176, 256), 14: (210, 256)}  # Q8_0, Q4_K, Q5_K, Q6_K → (bytes, weights) per block
_broken: str | None = None  # why the kernels were turned off in this process (a failed compile)


def handles(qtype: int, device: torch.device) -> bool:
    """Whether this tensor goes through a kernel here: a Q4_K/Q5_K/Q6_K/Q8_0 tensor on a CUDA device with
    Triton installed (`ONDEVICE_DEQUANT=torch` forces the torch path, for comparisons)."""
    return (
        triton is not None and device.type == "cuda" and int(qtype) in TYPES and _broken is None
        and os.environ.get("ONDEVICE_DEQUANT", "triton") != "torch"
    )  # fmt: skip


def dequantize(blocks: torch.Tensor, qtype: int, dtype: torch.dtype) -> torch.Tensor:
    """(n_blocks, type_size) uint8 → (n_blocks·weights per block,) weights of `dtype`, on the blocks' device."""
    n = blocks.shape[0]
    _, weights = TYPES[int(qtype)]
    out = torch.empty(n * weights, dtype=dtype, device=blocks.device)
    per_program = WEIGHTS_PER_PROGRAM // weights
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (a test) takes no compile options
    options = {} if interpreted else {"enable_fp_fusion": False}
    KERNELS[int(qtype)][(triton.cdiv(n, per_program),)](blocks, out, n, BLOCKS=per_program, **options)
    return out


def describe(device: torch.device) -> str:
    """Which path dequantizes the block types of TYPES on this device, for reports."""
    if handles(12, device):  # (any type of TYPES answers the same)
        return "triton"
    why = ("not a CUDA device" if device.type != "cuda" else "Triton is not installed" if triton is None
           else f"turned off: {_broken}" if _broken else "ONDEVICE_DEQUANT=torch")  # fmt: skip
    return f"torch ({why})"


def turn_off(error: BaseException) -> None:
    """A kernel failed (say, no compiler for this GPU): the torch path from now on, said once."""
    global _broken
    _broken = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    warnings.warn(f"the Triton dequantizer failed ({_broken}); streamed layers are dequantized in torch (slower)", stacklevel=2)


if triton is not None:

    @triton.jit
    def _f16_at(ptr, live):
        """Two little-endian bytes at ptr → float32."""
        lo = tl.load(ptr, mask=live, other=0).to(tl.uint16)
        hi = tl.load(ptr + 1, mask=live, other=0).to(tl.uint16)
        return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _int8_at(ptr, live):
        """One byte at ptr, read as int8 → int32."""
        return tl.load(ptr, mask=live, other=0).to(tl.int8, bitcast=True).to(tl.int32)

    @triton.jit
    def _program_blocks(raw, n_blocks, BLOCKS: tl.constexpr, SIZE: tl.constexpr, WEIGHTS: tl.constexpr):
        """This program's BLOCKS blocks of SIZE bytes and WEIGHTS weights: (block (BLOCKS, 1), the weight
        within its block p (1, WEIGHTS), which blocks exist, which weights exist, each block's first byte)."""
        block = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)[:, None]
        p = tl.arange(0, WEIGHTS)[None, :]
        live_block = block < n_blocks
        return block, p, live_block, live_block & (p < WEIGHTS), raw + block.to(tl.int64) * SIZE

    @triton.jit
    def _store(out, block, p, w, live, WEIGHTS: tl.constexpr):
        """The float32 weights w, rounded once to the output's dtype, at their places in `out`."""
        tl.store(out + block.to(tl.int64) * WEIGHTS + p, w.to(out.dtype.element_ty), mask=live)

    @triton.jit
    def _q4_k_kernel(raw, out, n_blocks, BLOCKS: tl.constexpr):
        _k_affine_kernel(raw, out, n_blocks, BLOCKS, 144, 16, False)

    @triton.jit
    def _q5_k_kernel(raw, out, n_blocks, BLOCKS: tl.constexpr):
        _k_affine_kernel(raw, out, n_blocks, BLOCKS, 176, 48, True)

    @triton.jit
    def _k_affine_kernel(raw, out, n_blocks, BLOCKS: tl.constexpr, SIZE: tl.constexpr, QS: tl.constexpr, FIFTH_BIT: tl.constexpr):
        """Q4_K (FIFTH_BIT False) and Q5_K: w = d·sc·q − dmin·m, 8 sub-blocks of 32 weights."""
        block, p, live_block, live, base = _program_blocks(raw, n_blocks, BLOCKS, SIZE, 256)
        d, dmin = _f16_at(base, live_block), _f16_at(base + 2, live_block)
        j = p // 32  # sub-block 0..7, each with a 6-bit scale and min packed into bytes 4..15
        sd = tl.load(base + 4 + j % 4, mask=live, other=0).to(tl.int32)
        sm = tl.load(base + 8 + j % 4, mask=live, other=0).to(tl.int32)
        smd = tl.load(base + 12 + j % 4, mask=live, other=0).to(tl.int32)
        sc = tl.where(j < 4, sd & 63, (smd & 15) | ((sd >> 2) & 48))
        mn = tl.where(j < 4, sm & 63, (smd >> 4) | ((sm >> 2) & 48))
        byte = tl.load(base + QS + 32 * (j // 2) + p % 32, mask=live, other=0).to(tl.int32)
        q = (byte >> (4 * (j % 2))) & 15
        if FIFTH_BIT:
            q = q | (((tl.load(base + 16 + p % 32, mask=live, other=0).to(tl.int32) >> j) & 1) << 4)
        scale = d * sc.to(tl.float32)
        offset = dmin * mn.to(tl.float32)
        _store(out, block, p, scale * q.to(tl.float32) - offset, live, 256)

    @triton.jit
    def _q6_k_kernel(raw, out, n_blocks, BLOCKS: tl.constexpr):
        block, p, live_block, live, base = _program_blocks(raw, n_blocks, BLOCKS, 210, 256)
        h, r = p // 128, p % 128
        low = (tl.load(base + 64 * h + r % 64, mask=live, other=0).to(tl.int32) >> (4 * (r // 64))) & 15
        high = (tl.load(base + 128 + 32 * h + r % 32, mask=live, other=0).to(tl.int32) >> (2 * (r // 32))) & 3
        q = (low | (high << 4)) - 32
        dd = _f16_at(base + 208, live_block) * _int8_at(base + 192 + p // 16, live).to(tl.float32)
        _store(out, block, p, dd * q.to(tl.float32), live, 256)

    @triton.jit
    def _q8_0_kernel(raw, out, n_blocks, BLOCKS: tl.constexpr):
        block, p, live_block, live, base = _program_blocks(raw, n_blocks, BLOCKS, 34, 32)
        _store(out, block, p, _int8_at(base + 2 + p, live).to(tl.float32) * _f16_at(base, live_block), live, 32)

    KERNELS = {8: _q8_0_kernel, 12: _q4_k_kernel, 13: _q5_k_kernel, 14: _q6_k_kernel}
