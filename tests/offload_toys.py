"""Small synthetic decoder stacks for the offload tests, in memory and as a GGUF file.

`ToyBlock` is RMSNorm + three Linears (+ a buffer, which must stay resident). `write_toy_gguf`
stores a stack's matrices in a mix of GGUF types — Q8_0 / Q5_0 made by gguf's own quantizer, Q4_K /
Q6_K as random blocks with finite scales (gguf cannot quantize K-quants), F16, F32 — and
`toy_stack_from_gguf` is the resident reference: every tensor dequantized by gguf's numpy code and
cast to the dtype, the way `ondevice.targets.weights` loads a model.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from torch import nn

K_SCALE_FIELDS = {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}  # byte offsets of f16 scales
MATRIX_TYPES = [QT.Q4_K, QT.Q8_0, QT.Q6_K, QT.Q5_0, QT.F16, QT.F32]


class ToyBlock(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 128):
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.mid = nn.Linear(hidden, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.register_buffer("gain", torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, dim) → (B, T, dim)
        h = F.silu(self.up(self.norm(x)))
        return x + self.gain * self.down(torch.tanh(self.mid(h)))


def toy_stack(n_layers: int = 6, dim: int = 64, hidden: int = 128, dtype=torch.float32, seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    blocks = nn.ModuleList(ToyBlock(dim, hidden) for _ in range(n_layers))
    with torch.no_grad():
        for block in blocks:
            block.norm.weight.uniform_(0.5, 1.5)
    return blocks.to(dtype)


def run_stack(blocks, x: torch.Tensor) -> torch.Tensor:
    for block in blocks:
        x = block(x)
    return x


def random_k_blocks(qtype: QT, n_blocks: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """Random K-quant blocks (every code and scale bit pattern) with finite, moderate f16 scales."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for offset in K_SCALE_FIELDS[qtype]:
        scales = rng.uniform(-scale, scale, n_blocks).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def encode(w: np.ndarray, qtype: QT, rng: np.random.Generator) -> np.ndarray:
    """w (rows, cols) float32 → what a GGUF stores for it (uint8 blocks, or f16/f32 values)."""
    if qtype == QT.F32:
        return w
    if qtype == QT.F16:
        return w.astype(np.float16)
    if qtype in K_SCALE_FIELDS:  # random blocks of about w's magnitude
        block, _ = GGML_QUANT_SIZES[qtype]
        scale = 0.02 if qtype == QT.Q4_K else 0.004  # Q4_K codes 0..15 × 6-bit scales; Q6_K ±32 × int8
        return random_k_blocks(qtype, w.size // block, rng, scale / np.sqrt(w.shape[1])).reshape(w.shape[0], -1)
    return gguf.quants.quantize(w, qtype)


def write_toy_gguf(path: str | Path, n_layers: int = 6, dim: int = 256, hidden: int = 256, seed: int = 0) -> Path:
    """A toy stack's tensors as blk.{i}.{param} in a GGUF, matrices in MATRIX_TYPES (cycled)."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "toy")
    writer.add_block_count(n_layers)
    k = 0
    for i in range(n_layers):
        writer.add_tensor(f"blk.{i}.norm.weight", rng.uniform(0.5, 1.5, dim).astype(np.float32))
        writer.add_tensor(f"blk.{i}.up.bias", (0.1 * rng.standard_normal(hidden)).astype(np.float32))
        for name, shape in (("up", (hidden, dim)), ("mid", (hidden, hidden)), ("down", (dim, hidden))):
            w = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
            qtype = MATRIX_TYPES[k % len(MATRIX_TYPES)]
            data = encode(w, qtype, rng)
            writer.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=qtype if data.dtype == np.uint8 else None)
            k += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def toy_names(i: int) -> dict[str, str]:
    """Block i's parameter names → its GGUF tensor names."""
    return {p: f"blk.{i}.{p}" for p in ("norm.weight", "up.weight", "up.bias", "mid.weight", "down.weight")}


def toy_stack_from_gguf(path: str | Path, dtype=torch.float32) -> nn.ModuleList:
    """The resident reference: gguf's numpy dequantization, cast to dtype like weights.py does."""
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    n_layers = sum(1 for name in tensors if name.endswith(".norm.weight"))
    dim, hidden = (int(d) for d in tensors["blk.0.up.weight"].shape)
    blocks = toy_stack(n_layers, dim, hidden, dtype)
    for i, block in enumerate(blocks):
        state = {}
        for param, name in toy_names(i).items():
            t = tensors[name]
            w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))
            state[param] = torch.from_numpy(np.require(w, np.float32, ["C", "W"])).to(dtype)
        block.load_state_dict(state, strict=False)
    return blocks
