"""offload/streamer.py: LayerStreamer delivers every streamed layer's weights, in pass order, through
a ring of bounded size. The reference is the same stack kept resident (RAM tier) or dequantized by
gguf's numpy code (disk tier); the "device" is the CPU, so copies really go through the ring.
"""

from __future__ import annotations

import copy

import pytest
import torch

from offload_toys import run_stack, toy_names, toy_stack, toy_stack_from_gguf, write_toy_gguf
from ondevice.offload.build import gguf_layouts, offload_blocks, param_layouts
from ondevice.offload.placement import Placement
from ondevice.offload.streamer import LayerStreamer

N_LAYERS = 5


def placement(layouts, from_ram, from_disk=(), ring_slots=2) -> Placement:
    streamed = set(from_ram) | set(from_disk)
    on_device = tuple(i for i in layouts if i not in streamed)
    transfer = tuple(layout.nbytes for layout in layouts.values())
    return Placement(on_device, tuple(from_ram), tuple(from_disk), transfer, 0, 0, ring_slots, "CPU")


def watch_weights(blocks) -> list[tuple[int, dict[str, torch.Tensor]]]:
    """Record (layer, its parameters) as each block starts computing, after the streamer loaded it."""
    seen = []
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda b, args, i=i: seen.append((i, {n: p.clone() for n, p in b.named_parameters()})))
    return seen


def assert_weights_equal(seen, reference) -> None:
    for i, params in seen:
        expected = dict(reference[i].named_parameters())
        assert params.keys() == expected.keys()
        for name, value in params.items():
            assert torch.equal(value, expected[name]), (i, name)


def max_in_flight(trace) -> int:
    outstanding = most = 0
    for event in trace:
        outstanding += {"issue": 1, "release": -1}.get(event.kind, 0)
        most = max(most, outstanding)
    return most


@pytest.mark.parametrize("ring_slots", [1, 2, 3])
def test_every_layer_gets_its_own_weights_in_order_through_a_bounded_ring(ring_slots):
    reference = toy_stack(N_LAYERS)
    blocks = copy.deepcopy(reference)
    layouts = param_layouts(blocks)
    streamer = offload_blocks(blocks, placement(layouts, from_ram=(0, 2, 3, 4), ring_slots=ring_slots), "cpu", layouts, trace=True)
    assert isinstance(streamer, LayerStreamer)
    seen = watch_weights(blocks)
    with torch.inference_mode():
        for _ in range(2):
            x = torch.randn(1, 3, 64)
            assert torch.equal(run_stack(blocks, x), run_stack(reference, x))
    streamer.close()
    assert [i for i, _ in seen] == list(range(N_LAYERS)) * 2
    assert_weights_equal(seen, reference)
    assert max_in_flight(streamer.trace) <= ring_slots
    assert [e.layer for e in streamer.trace if e.kind == "consume"] == [0, 2, 3, 4] * 2
    assert blocks[0].up.weight.is_meta and not blocks[1].up.weight.is_meta  # streamed weights are let go


def test_disk_layers_arrive_as_the_files_weights(tmp_path):
    path = write_toy_gguf(tmp_path / "toy.gguf", n_layers=N_LAYERS)
    reference = toy_stack_from_gguf(path)
    blocks = toy_stack_from_gguf(path)
    layouts = gguf_layouts(blocks, str(path), toy_names)
    plan = placement(layouts, from_ram=(1,), from_disk=(0, 3, 4))
    streamer = offload_blocks(blocks, plan, "cpu", layouts, model_path=str(path), disk_buffers=2, trace=True, timeout_s=30)
    seen = watch_weights(blocks)
    with torch.inference_mode():
        run_stack(blocks, torch.randn(1, 2, 256))
    stats = streamer.collect_stats()
    streamer.close()
    assert [i for i, _ in seen] == list(range(N_LAYERS))
    assert_weights_equal(seen, reference)
    assert max_in_flight(streamer.trace) <= plan.ring_slots
    assert stats.disk_bytes_read >= sum(layouts[i].nbytes for i in (0, 3, 4))
