"""Group-wise int8 / int4 quantization in torch, for moving fp16/bf16/fp32 weights over PCIe.

A weight (..., in_features) is cut along its last dimension into groups of `group` values; each
group gets a float32 scale (and, asymmetric, a float32 offset: the group minimum).

  symmetric:   s = max|w| / qmax,          q = round(w / s) ∈ [−qmax, qmax],   ŵ = s·q
  asymmetric:  s = (max w − min w) / qmax,  q = round((w − min) / s) ∈ [0, qmax], ŵ = s·q + min
  qmax = 127 (int8, symmetric), 7 (int4, symmetric), 255 / 15 (asymmetric).

Error bound (checked in tests/test_quant.py): |w − ŵ| ≤ s/2 for every weight, up to float32
rounding of s, q·s and the offset (a relative 2⁻²² of the group's magnitude); the result is then
rounded to the caller's dtype (bf16: a further relative 2⁻⁹). Packed bytes per weight:
int8 → 1 + 4/group (+ 4/group asymmetric), int4 → 0.5 + 4/group (+ 4/group).
This is lossy: a model streamed this way is the quantized model, not the one loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupSpec:
    bits: int = 8  # 8 or 4
    group: int = 64
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"group-wise quantization has 4 or 8 bits, not {self.bits}")
        if self.group < 2 or self.group % 2:
            raise ValueError(f"group size must be even and ≥ 2, not {self.group}")

    @property
    def qmax(self) -> int:
        return (1 << self.bits) - 1 if not self.symmetric else (1 << (self.bits - 1)) - 1

    @property
    def name(self) -> str:
        return f"int{self.bits}-g{self.group}-{'sym' if self.symmetric else 'asym'}"

    @classmethod
    def parse(cls, text: str) -> "GroupSpec":
        """'int8-g64', 'int4-g128-asym' → GroupSpec."""
        m = re.fullmatch(r"int([48])-g(\d+)(?:-(sym|asym))?", text.strip().lower())
        if not m:
            raise ValueError(f"not a group-wise format: {text!r} (e.g. 'int8-g64', 'int4-g128-asym')")
        return cls(int(m[1]), int(m[2]), m[3] != "asym")

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a tensor of this shape can be grouped (last dim a multiple of the group)."""
        return len(shape) >= 1 and shape[-1] % self.group == 0

    def packed_bytes(self, numel: int) -> int:
        n_groups = numel // self.group
        q_bytes = numel if self.bits == 8 else numel // 2
        return q_bytes + 4 * n_groups * (1 if self.symmetric else 2)


def quantize(w: torch.Tensor, spec: GroupSpec) -> torch.Tensor:
    """w (..., k) with k % group == 0 → 1-D uint8: [codes | scales f32 | (mins f32)]."""
    if not spec.fits(tuple(w.shape)):
        raise ValueError(f"last dim of {tuple(w.shape)} is not a multiple of group {spec.group}")
    g = w.detach().to(torch.float32).reshape(-1, spec.group)  # (n_groups, group)
    if spec.symmetric:
        scale = g.abs().amax(dim=1, keepdim=True) / spec.qmax  # (n_groups, 1)
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        q = torch.round(g * inv).clamp(-spec.qmax, spec.qmax)
        codes = (q + (spec.qmax + 1)).to(torch.uint8)  # offset binary: 1 … 2·qmax+1
        parts = [scale]
    else:
        low = g.amin(dim=1, keepdim=True)
        scale = (g.amax(dim=1, keepdim=True) - low) / spec.qmax
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        codes = torch.round((g - low) * inv).clamp(0, spec.qmax).to(torch.uint8)
        parts = [scale, low]
    if spec.bits == 4:
        codes = codes.reshape(-1, 2)
        codes = codes[:, 0] | (codes[:, 1] << 4)  # two codes per byte, first in the low nibble
    floats = [p.reshape(-1).contiguous().view(torch.uint8) for p in parts]
    return torch.cat([codes.reshape(-1), *floats])


def dequantize(packed: torch.Tensor, spec: GroupSpec, shape: tuple[int, ...]) -> torch.Tensor:
    """The inverse of `quantize`: 1-D uint8 (any device) → float32 tensor of `shape`."""
    numel = 1
    for dim in shape:
        numel *= int(dim)
    if packed.dtype != torch.uint8 or packed.numel() != spec.packed_bytes(numel):
        raise ValueError(f"{spec.name} {tuple(shape)} needs {spec.packed_bytes(numel)} uint8 bytes")
    n_groups = numel // spec.group
    q_bytes = numel if spec.bits == 8 else numel // 2
    codes = packed[:q_bytes]
    if spec.bits == 4:
        codes = torch.stack([codes & 0x0F, codes >> 4], dim=-1)  # (numel/2, 2)
    q = codes.reshape(n_groups, spec.group).to(torch.float32)
    floats = packed[q_bytes:]
    if floats.storage_offset() % 4:  # a float32 view needs 4-byte alignment
        floats = floats.clone()
    floats = floats.view(torch.float32).reshape(-1, n_groups, 1)  # (1 or 2, n_groups, 1)
    if spec.symmetric:
        w = floats[0] * (q - (spec.qmax + 1))
    else:
        w = floats[0] * q + floats[1]
    return w.reshape(shape)
