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
from ondevice.target.offloaded import load_offloaded_target, plan_offload
from ondevice.synthetic.offloaded import model_args, offloaded_target
from ondevice.synthetic.shapes import ModelShape
from ondevice.synthetic.writer import write_synthetic_gguf
from ondevice.target import weights
from ondevice.tree import DraftTree

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
    assert model_args(shape) == weights.gguf_model_args(weights.open_gguf(path))
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
