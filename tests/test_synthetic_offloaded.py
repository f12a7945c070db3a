"""The synthetic torch target built in memory (synthetic/offloaded.py) is the model a written file
of the same shape gives the loader: the same hyper-parameters as its header says, the same
placement under the same budgets, and (exact=True) bit-identical logits while streaming.

The reference is independent of the builder: a GGUF written by `synthetic.writer`, read back by
gguf's reader and loaded by `target.offloaded.load_offloaded_target` (numpy dequantization for the
resident tensors, file reads for the streamed layers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ondevice.errors import OndeviceError
from ondevice.files.architecture import gguf_model_args
from ondevice.targets.offloaded import load_offloaded_target, plan_offload
from ondevice.synthetic.offloaded import model_args, offloaded_target
from ondevice.synthetic.shapes import ModelShape
from ondevice.synthetic.writer import write_synthetic_gguf
from ondevice.targets import weights
from ondevice.decode.tree import DraftTree

SHAPES = [
    ModelShape("s-llama", "llama", 6, 256, 512, 4, 2, 64, 512, rope_factor=8.0),  # Q/K rows unpermuted after each transfer
    ModelShape("s-qwen2", "qwen2", 6, 384, 640, 6, 2, 64, 512),  # biases; Q5_0 / Q8_0 fallbacks
    ModelShape("s-qwen3", "qwen3", 6, 256, 512, 4, 2, 64, 512, tied=True),  # q/k norms; a tied head copied to fp32
]


def budget_for_two_layers(path) -> str:
    plan = plan_offload(path, "cpu", torch.float32, 128, str(1 << 40), None, max_tree=16)
    moved = max(layout.nbytes for layout in plan.layouts.values())
    decoded = max(layout.decoded_bytes for layout in plan.layouts.values())
    return str(plan.resident_bytes + 2 * moved + 3 * decoded)  # ring + scratch + 2 layers


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.arch)
def test_the_built_target_is_the_written_file(tmp_path, shape):
    path = write_synthetic_gguf(shape, tmp_path / "model.gguf", seed=3, show=False)
    assert model_args(shape) == gguf_model_args(weights.open_gguf(path))
    budget = budget_for_two_layers(path)
    reference = load_offloaded_target(path, "cpu", gpu_memory=budget, ram_memory="1GB", n_ctx=128, max_tree=16)
    built = offloaded_target(shape, "cpu", gpu_memory=budget, ram_memory="1GB", n_ctx=128, max_tree=16, seed=3, exact=True)
    try:
        assert built.placement == reference.placement and len(built.placement.on_device) == 2 and built.placement.from_ram
        tree = DraftTree.chain(1, [5, 7, 9])
        for target in (reference, built):
            target.prefill([3, 4, 5, 6, 8])
        got, expected = built.forward_tree(tree), reference.forward_tree(tree)
        assert np.isfinite(expected).all() and np.array_equal(got, expected)
        assert built.streamer.collect_stats().bytes_per_pass == built.placement.bytes_per_pass  # every streamed layer, each pass
    finally:
        reference.close()
        built.close()


def test_streamed_layers_need_ram_there_is_no_file_for_a_disk_tier():
    shape = SHAPES[0]
    with pytest.raises(OndeviceError, match="needs RAM for all 6 streamed layers"):
        offloaded_target(shape, "cpu", gpu_memory="12MB", ram_memory="1MB", n_ctx=128, max_tree=16)


def three_passes(target) -> list[np.ndarray]:
    """Prefill, then two tree passes with a commit between: the logits of each pass."""
    target.prefill([3, 4, 5, 6, 8])
    first = target.forward_tree(DraftTree.chain(1, [5, 7, 9]))
    target.commit([0, 1])
    return [first, target.forward_tree(DraftTree.chain(2, [11, 13]))]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.arch)
def test_layers_kept_encoded_compute_what_decoded_ones_do(tmp_path, shape):
    """The same budget holds more layers as GGUF blocks (decoded for each pass, offload/encoded.py)
    than decoded: fewer bytes move per pass, the logits stay the same bits, for a file and for
    the model built in memory alike."""
    path = write_synthetic_gguf(shape, tmp_path / "model.gguf", seed=3, show=False)
    budget = budget_for_two_layers(path)
    common = dict(gpu_memory=budget, ram_memory="1GB", n_ctx=128, max_tree=16)
    decoded = load_offloaded_target(path, "cpu", keep_encoded=False, **common)
    encoded = load_offloaded_target(path, "cpu", keep_encoded=True, **common)
    built = offloaded_target(shape, "cpu", seed=3, exact=True, keep_encoded=True, **common)
    try:
        kept = encoded.placement.encoded_on_device
        assert decoded.placement.encoded_on_device == () and len(decoded.placement.on_device) == 2
        assert len(kept) > 2 and encoded.placement.on_device == () and encoded.placement.bytes_per_pass < decoded.placement.bytes_per_pass
        assert built.placement == encoded.placement and "kept encoded on CPU" in encoded.placement.describe()
        expected = three_passes(decoded)
        for target in (encoded, built):
            assert all(np.array_equal(got, want) for got, want in zip(three_passes(target), expected, strict=True))
            assert all(p.is_meta for i in kept for p in target.model.layers[i].parameters())  # decoded only while computing
            if target.streamer is not None:
                assert target.streamer.collect_stats().bytes_per_pass == target.placement.bytes_per_pass
    finally:
        for target in (decoded, encoded, built):
            target.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_with_triton_layers_stay_encoded_by_default(tmp_path):
    """Where the Triton kernels decode every tensor (Q4_K, Q6_K: the llama shape's mix), the target
    keeps its device layers encoded unasked, and computes what decoded layers compute."""
    pytest.importorskip("triton")
    shape = SHAPES[0]
    path = write_synthetic_gguf(shape, tmp_path / "model.gguf", seed=3, show=False)
    plan = plan_offload(path, "cuda", torch.bfloat16, 128, str(1 << 40), None, max_tree=16, keep_encoded=False)
    moved = max(layout.nbytes for layout in plan.layouts.values())
    decoded_size = max(layout.decoded_bytes for layout in plan.layouts.values())
    common = dict(gpu_memory=str(plan.resident_bytes + 2 * moved + 3 * decoded_size), ram_memory="1GB", n_ctx=128, max_tree=16)
    auto = load_offloaded_target(path, "cuda", **common)
    decoded = load_offloaded_target(path, "cuda", keep_encoded=False, **common)
    try:
        assert len(auto.placement.encoded_on_device) > len(decoded.placement.on_device) == 2
        assert all(np.array_equal(a, b) for a, b in zip(three_passes(auto), three_passes(decoded), strict=True))
    finally:
        auto.close()
        decoded.close()
