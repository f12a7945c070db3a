"""Quantized transfer formats against independent references.

- GGUF blocks: our torch dequantizer vs gguf's numpy `dequantize`, bit for bit, on tensors of the
  real 1.5B file (skipped when it is not downloaded) and on synthetic blocks: made by
  `gguf.quants.quantize` where gguf can quantize (Q8_0, Q5_0, Q4_0), random bit patterns with
  finite scales where it cannot (Q4_K, Q5_K, Q6_K).
- Group-wise int8 / int4: the error bound stated in groupwise.py, checked weight by weight.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT, GGUFReader
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize

from offload_toys import K_SCALE_FIELDS, random_k_blocks
from ondevice.quant import gguf_blocks, groupwise
from ondevice.quant.groupwise import GroupSpec

# one of each type the file uses (Q4_K, Q6_K, F32), small enough to check in a second
REAL_TENSORS = [
    "blk.0.attn_q.weight",
    "blk.0.attn_v.weight",
    "blk.0.attn_q.bias",
    "blk.0.attn_norm.weight",
    "blk.0.ffn_down.weight",
]


def bytes_of(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8).copy())


def assert_bit_exact(ours: torch.Tensor, reference: np.ndarray) -> None:
    reference = np.ascontiguousarray(reference, dtype=np.float32)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == reference.shape
    assert np.array_equal(ours.numpy().view(np.uint32), reference.view(np.uint32))


@pytest.fixture(scope="module")
def real_tensors(real_pair):
    return {t.name: t for t in GGUFReader(real_pair.target).tensors}  # ~15 s: gguf parses the whole vocab


@pytest.mark.parametrize("name", REAL_TENSORS)
def test_real_tensors_bit_exact(real_tensors, name):
    tensor = real_tensors[name]
    shape = tuple(int(d) for d in reversed(tensor.shape))
    ours = gguf_blocks.dequantize(bytes_of(tensor.data), tensor.tensor_type, shape)
    assert_bit_exact(ours, gguf_dequantize(tensor.data, tensor.tensor_type).reshape(shape))


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q5_0, QT.Q4_0, QT.F16, QT.BF16])
def test_gguf_quantized_blocks_bit_exact(qtype):
    rng = np.random.default_rng(int(qtype))
    w = (rng.standard_normal((48, 128)) * rng.uniform(1e-3, 3.0, (48, 1))).astype(np.float32)
    w[0] = 0.0  # an all-zero block (scale 0)
    blocks = gguf_quantize(w, qtype)
    ours = gguf_blocks.dequantize(bytes_of(blocks), qtype, w.shape)
    assert_bit_exact(ours, gguf_dequantize(blocks, qtype))


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0, QT.Q5_0])
def test_random_bit_patterns_bit_exact(qtype):
    rng = np.random.default_rng(int(qtype))
    block, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in K_SCALE_FIELDS:
        blocks = random_k_blocks(qtype, 64, rng)
    else:  # leading f16 scale, the rest random
        blocks = rng.integers(0, 256, (64, type_size), dtype=np.uint8)
        blocks[:, :2] = rng.uniform(-1, 1, 64).astype(np.float16).view(np.uint8).reshape(64, 2)
    ours = gguf_blocks.dequantize(bytes_of(blocks), qtype, (64, block))
    assert_bit_exact(ours, gguf_dequantize(blocks, qtype))


def _triton_case(qtype: QT, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """37 random blocks (not a multiple of a program's: the masked tail) → (ours, gguf's numpy cast to dtype)."""
    rng = np.random.default_rng(int(qtype))
    block, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in K_SCALE_FIELDS:
        blocks = random_k_blocks(qtype, 37, rng)
    else:  # Q8_0: a leading f16 scale, the rest random
        blocks = rng.integers(0, 256, (37, type_size), dtype=np.uint8)
        blocks[:, :2] = rng.uniform(-1, 1, 37).astype(np.float16).view(np.uint8).reshape(37, 2)
    reference = torch.from_numpy(np.ascontiguousarray(gguf_dequantize(blocks, qtype), dtype=np.float32)).reshape(37, block)
    return gguf_blocks.dequantize(bytes_of(blocks).to(device), qtype, (37, block), dtype).cpu(), reference.to(dtype)


TRITON_TYPES = [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q8_0]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.view(as_int), b.view(as_int))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("qtype", TRITON_TYPES)
def test_gpu_dequantizer_bit_exact(qtype, dtype):
    """On a GPU, Q4_K/Q5_K/Q6_K/Q8_0 go through gguf_triton's kernels (where Triton is installed): the same
    bits as gguf's numpy dequantizer rounded to the model's dtype, and as the torch path."""
    from ondevice.quant import gguf_triton

    ours, reference = _triton_case(qtype, "cuda", dtype)
    assert _same_bits(ours, reference)
    if gguf_triton.triton is not None:
        assert gguf_triton.describe(torch.device("cuda")) == "triton"  # no failure turned the kernels off
        assert gguf_blocks.fast_path_works(qtype, torch.device("cuda"), dtype)  # and the check before a placement agrees


INTERPRETED = """
import sys, torch
sys.path.insert(0, {tests!r})
from gguf import GGMLQuantizationType as QT
from ondevice.quant import gguf_blocks, gguf_triton
from test_quant import TRITON_TYPES, _same_bits, _triton_case
gguf_triton.handles = lambda qtype, device: True  # the interpreter runs the kernels on the CPU
for qtype in TRITON_TYPES:
    for dtype in (torch.float32, torch.float16):  # the interpreter rounds to bfloat16 by truncation, a GPU to nearest
        ours, reference = _triton_case(qtype, "cpu", dtype)
        assert _same_bits(ours, reference), (qtype, dtype)
assert all(gguf_blocks.fast_path_works(qtype, torch.device("cpu"), torch.float16) for qtype in TRITON_TYPES)  # the self-check agrees
assert gguf_triton._broken is None, gguf_triton._broken  # no kernel failed over to the torch path
print("ok")
"""


def test_triton_kernels_in_the_interpreter(tmp_path):
    """The kernels' index arithmetic on a CPU, in Triton's interpreter (TRITON_INTERPRET=1), where Triton is installed."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = INTERPRETED.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_dequantize_rejects_wrong_sizes():
    with pytest.raises(ValueError):
        gguf_blocks.dequantize(torch.zeros(143, dtype=torch.uint8), QT.Q4_K, (256,))
    with pytest.raises(ValueError):
        gguf_blocks.byte_size(QT.Q4_K, (100,))


SPECS = [GroupSpec(8, 64, True), GroupSpec(8, 128, False), GroupSpec(4, 64, True), GroupSpec(4, 128, False)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_groupwise_error_bound(spec):
    rng = np.random.default_rng(spec.bits * spec.group)
    w = torch.from_numpy((rng.standard_normal((96, 256)) * rng.uniform(1e-4, 2, (96, 1))).astype(np.float32))
    w[3, : spec.group] = 0.0  # an all-zero group
    w[5, 7] = 40.0  # an outlier
    packed = groupwise.quantize(w, spec)
    assert packed.dtype == torch.uint8 and packed.numel() == spec.packed_bytes(w.numel())
    restored = groupwise.dequantize(packed, spec, tuple(w.shape))
    groups = w.reshape(-1, spec.group)
    span = groups.abs().amax(1) * 2 if spec.symmetric else groups.amax(1) - groups.amin(1)
    step = span / (2 * spec.qmax if spec.symmetric else spec.qmax)  # the scale s, recomputed here
    error = (restored - w).abs().reshape(-1, spec.group).amax(1)
    slack = groups.abs().amax(1) * 2**-20  # float32 rounding of s, q·s and the offset
    assert torch.all(error <= step / 2 + slack)
    assert torch.equal(restored[3, : spec.group], torch.zeros(spec.group))  # zero groups come back exactly


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_groupwise_half_precision_weights(dtype):
    w = (torch.randn(32, 128, generator=torch.Generator().manual_seed(1)) * 0.02).to(dtype)
    spec = GroupSpec(8, 64)
    restored = groupwise.dequantize(groupwise.quantize(w, spec), spec, tuple(w.shape)).to(dtype)
    step = w.float().abs().reshape(-1, 64).amax(1, keepdim=True) / spec.qmax
    # rounding to dtype moves a value by ≤ half an ulp of the group's largest: amax·2⁻⁹ (bf16), amax·2⁻¹² (f16)
    amax = w.float().abs().reshape(-1, 64).amax(1, keepdim=True)
    ulp = amax * (2**-8 if dtype == torch.bfloat16 else 2**-11) + 2**-24  # + f16's subnormal step
    assert torch.all((restored.float() - w.float()).abs().reshape(-1, 64) <= step / 2 + ulp)


def test_groupspec_parse_and_errors():
    assert GroupSpec.parse("int4-g128-asym") == GroupSpec(4, 128, False)
    assert GroupSpec.parse("int8-g64") == GroupSpec(8, 64, True)
    for bad in ("int3-g64", "int8", "fp8-g64"):
        with pytest.raises(ValueError):
            GroupSpec.parse(bad)
    with pytest.raises(ValueError):
        groupwise.quantize(torch.zeros(4, 100), GroupSpec(8, 64))
