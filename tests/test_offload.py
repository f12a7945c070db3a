"""Offloading: the streamer's schedule, and streamed == resident, bit for bit (the placement math:
test_placement.py).

References are independent of the code under test: the same blocks kept resident (or, for GGUF
layers, built by gguf's numpy dequantizer).
On this CPU-only machine the "device" is the CPU: copies still go through the ring buffers on a
worker thread, so order, prefetch depth and slot reuse are real. CUDA tests skip without a GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import os

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from offload_toys import run_stack, toy_names, toy_stack, toy_stack_from_gguf, write_toy_gguf
from ondevice.errors import OndeviceError
from ondevice.files.architecture import GGUF_NAMES, gguf_model_args
from ondevice.offload.build import gguf_layouts, gguf_names_from_table, offload_blocks, param_layouts, plan_for
from ondevice.offload.placement import Placement
from ondevice.quant import groupwise
from ondevice.quant.groupwise import GroupSpec
from ondevice.targets import weights
from ondevice.targets.torch_model import KVCache, Transformer, TransformerBlock, rope_angles, rope_inv_freq
from ondevice.targets.torch_target import TorchTarget
from ondevice.decode.tree import DraftTree
from tiny_models import write_tiny_gguf


def fixed_placement(layouts, on_device, from_ram, from_disk, ring_slots=2, kind="CPU") -> Placement:
    """A placement chosen by the test rather than planned (budgets unused)."""
    transfer = tuple(layout.nbytes for layout in layouts.values())
    return Placement(tuple(on_device), tuple(from_ram), tuple(from_disk), transfer, 0, 0, ring_slots, kind)


# --- the schedule ------------------------------------------------------------------------------


def streamed_toy(ring_slots: int, on_device=(3,), n_layers: int = 6, dtype=torch.float32, spec=None, trace=True):
    """(resident reference, streamed copy, streamer) of the same toy stack on the CPU."""
    reference = toy_stack(n_layers, dtype=dtype)
    blocks = copy.deepcopy(reference)
    layouts = param_layouts(blocks, spec)
    streamed = tuple(i for i in range(n_layers) if i not in on_device)
    placement = fixed_placement(layouts, on_device, streamed, (), ring_slots)
    return reference, blocks, offload_blocks(blocks, placement, "cpu", layouts, trace=trace, check=spec is None)


@pytest.mark.parametrize("ring_slots", [1, 2, 3])
def test_schedule_order_prefetch_and_slot_reuse(ring_slots):
    reference, blocks, streamer = streamed_toy(ring_slots)
    with torch.inference_mode():
        for _ in range(3):
            run_stack(blocks, torch.randn(1, 3, 64))
    streamer.close()
    trace, k = streamer.trace, ring_slots
    when = {(e.kind, e.seq): n for n, e in enumerate(trace)}  # event → its place in time
    consumed = [e for e in trace if e.kind == "consume"]
    order = [0, 1, 2, 4, 5]  # layer 3 is resident
    assert [e.layer for e in consumed] == order * 3
    assert [e.seq for e in consumed] == list(range(15))
    assert all(e.slot == e.seq % k for e in trace)  # a fixed ring: slot = seq mod k
    for s in range(15):
        assert when["issue", s] < when["consume", s] < when["release", s]
        if s >= k:  # a slot is refilled only after its previous layer released it
            assert when["release", s - k] < when["issue", s]
        if s + k - 1 < 15 and s >= 1:  # prefetch depth: k copies are out when a layer starts
            assert when["issue", s + k - 1] < when["consume", s]
    outstanding = 0  # copies issued and not yet released never exceed the ring
    for e in trace:
        outstanding += {"issue": 1, "release": -1}.get(e.kind, 0)
        assert outstanding <= k
    # the last layers of a pass prefetch the first ones of the next (with k = 1: only once it is done)
    assert when["issue", 15] < when["consume", 14] if k > 1 else when["release", 14] < when["issue", 15]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ring_slots", [1, 2])
def test_streamed_equals_resident(dtype, ring_slots):
    reference, blocks, streamer = streamed_toy(ring_slots, on_device=(1, 4), dtype=dtype)
    with torch.inference_mode():
        for n in range(4):
            x = torch.randn(2, 1 + n, 64, dtype=dtype)
            assert torch.equal(run_stack(blocks, x), run_stack(reference, x))
    stats = streamer.collect_stats()
    streamer.close()
    assert stats.passes == 4 and stats.resyncs == 0
    assert stats.bytes_per_pass == sum(streamer.order[p].layout.nbytes for p in range(4))
    assert stats.bandwidth > 0 and set(stats.wait_seconds) == {0, 2, 3, 5}
    assert blocks[0].up.weight.is_meta and not blocks[1].up.weight.is_meta  # streamed weights are let go


def test_groupwise_transfer_equals_quantized_reference():
    spec = GroupSpec(4, 64, symmetric=False)
    reference, blocks, streamer = streamed_toy(2, on_device=(), dtype=torch.bfloat16, spec=spec, trace=False)
    with torch.no_grad():  # the independent reference: each matrix through quantize → dequantize
        for block in reference:
            for linear in (block.up, block.mid, block.down):
                w = linear.weight
                w.copy_(groupwise.dequantize(groupwise.quantize(w, spec), spec, tuple(w.shape)).to(w.dtype))
    with torch.inference_mode():
        for _ in range(2):
            x = torch.randn(1, 4, 64, dtype=torch.bfloat16)
            assert torch.equal(run_stack(blocks, x), run_stack(reference, x))
    assert streamer.order[0].layout.nbytes < 0.4 * param_layouts(reference)[0].nbytes  # ~4.5 bits vs 16
    streamer.close()


def test_resync_after_a_pass_dies_midway():
    reference, blocks, streamer = streamed_toy(2)
    failures = [RuntimeError("die")]

    def raise_once(module, args):  # runs after the streamer's pre-hook: layer 2 dies holding its slot
        if failures:
            raise failures.pop()

    blocks[2].register_forward_pre_hook(raise_once)
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="die"):
            run_stack(blocks, torch.randn(1, 2, 64))
        for _ in range(2):
            x = torch.randn(1, 2, 64)
            assert torch.equal(run_stack(blocks, x), run_stack(reference, x))
        assert torch.equal(blocks[4](x), reference[4](x))  # a layer called on its own: resync again
    assert streamer.stats.resyncs == 2
    streamer.close()


# --- GGUF layers: RAM and disk tiers -------------------------------------------------------------


@pytest.fixture()
def toy_gguf(tmp_path):
    return write_toy_gguf(tmp_path / "toy.gguf")


def gguf_streamer(path, dtype, on_device, from_ram, from_disk, disk_buffers=2, timeout_s=120.0):
    blocks = toy_stack_from_gguf(path, dtype)  # loaded, so offload_blocks checks every buffer
    layouts = gguf_layouts(blocks, str(path), toy_names)
    placement = fixed_placement(layouts, on_device, from_ram, from_disk)
    streamer = offload_blocks(
        blocks, placement, "cpu", layouts, model_path=str(path), disk_buffers=disk_buffers, timeout_s=timeout_s
    )
    return blocks, streamer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_ram_and_disk_tiers_equal_resident(toy_gguf, dtype):
    reference = toy_stack_from_gguf(toy_gguf, dtype)
    blocks, streamer = gguf_streamer(toy_gguf, dtype, on_device=(2,), from_ram=(0, 3), from_disk=(1, 4, 5))
    with torch.inference_mode():
        for _ in range(3):
            x = torch.randn(1, 5, 256, dtype=dtype)
            assert torch.equal(run_stack(blocks, x), run_stack(reference, x))
    stats = streamer.collect_stats()
    streamer.close()
    layer_bytes = {layer.index: layer.layout.nbytes for layer in streamer.order}
    disk_per_pass = layer_bytes[1] + layer_bytes[4] + layer_bytes[5]
    # every pass reads its disk layers again; prefetch may be up to 2 copies (ring) + 2 reads (staging)
    # into the next pass
    assert 3 * disk_per_pass <= stats.disk_bytes_read <= 3 * disk_per_pass + (2 + 2) * max(layer_bytes.values())
    assert stats.disk_bandwidth > 0 and stats.bytes_per_pass == sum(layer_bytes.values())


@pytest.mark.parametrize("damage", ["delete", "truncate", "replace"])
def test_model_file_vanishing_midrun_is_a_one_line_error(toy_gguf, damage):
    blocks, streamer = gguf_streamer(toy_gguf, torch.float32, (), (), tuple(range(6)), timeout_s=10)
    with torch.inference_mode():
        run_stack(blocks, torch.randn(1, 2, 256))
        if damage == "delete":
            os.remove(toy_gguf)
        elif damage == "truncate":
            os.truncate(toy_gguf, os.path.getsize(toy_gguf) // 2)
        else:
            data = toy_gguf.read_bytes()
            os.remove(toy_gguf)
            toy_gguf.write_bytes(data)  # same bytes, a different file
        with pytest.raises(OndeviceError) as err:  # the file's own error, not the streamer's 10 s timeout
            for _ in range(2):
                run_stack(blocks, torch.randn(1, 2, 256))
        with pytest.raises(OndeviceError):  # and it stays an error, not a hang
            run_stack(blocks, torch.randn(1, 2, 256))
    assert "\n" not in str(err.value) and str(toy_gguf) in str(err.value)
    assert ("shrank" if damage == "truncate" else "vanished") in str(err.value)
    streamer.close()


def test_gguf_layouts_hold_the_files_blocks(toy_gguf):
    blocks = toy_stack_from_gguf(toy_gguf, torch.bfloat16)
    layouts = gguf_layouts(blocks, str(toy_gguf), toy_names)
    reader = {t.name: t for t in gguf.GGUFReader(str(toy_gguf)).tensors}
    for i, layout in layouts.items():
        assert {t.name for t in layout.tensors} == set(dict(blocks[i].named_parameters()))
        for entry in layout.tensors:
            info = reader[toy_names(i)[entry.name]]
            assert (entry.qtype, entry.nbytes) == (int(info.tensor_type), int(info.n_bytes))
            assert entry.dtype == torch.bfloat16 and entry.shape == tuple(blocks[i].get_parameter(entry.name).shape)
        # one run per layer (its tensors are adjacent in the file): one read
        assert len(layout.file_ranges) == 1 and layout.file_ranges[0].nbytes <= layout.nbytes
    placement = plan_for(layouts, 0, device="cpu", device_budget="1GB", ram_budget="1GB")
    assert placement.on_device == tuple(range(6))


# --- the PyTorch target's own blocks (torch_model.py) ------------------------------------------


LAYER_GGUF_NAMES = gguf_names_from_table(GGUF_NAMES)


def streamed_target(path, dtype, from_ram, from_disk) -> TorchTarget:
    args, state_dict = weights.load_gguf(path, dtype)
    model = Transformer.from_state_dict(args, state_dict)
    unpermute = (
        (lambda i: {"attention.wq.weight": args.n_heads, "attention.wk.weight": args.n_kv_heads})
        if args.arch == "llama"
        else None
    )
    layouts = gguf_layouts(model.layers, str(path), LAYER_GGUF_NAMES, unpermute)
    placement = fixed_placement(layouts, (), from_ram, from_disk)
    target = TorchTarget(model, n_ctx=64)
    target.streamer = offload_blocks(model.layers, placement, "cpu", layouts, model_path=str(path))
    return target


@pytest.mark.parametrize("arch, file_dtype", [("qwen2", "f32"), ("llama", "f16")])
def test_tiny_target_streamed_equals_resident(tmp_path, arch, file_dtype):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, dtype=file_dtype)
    resident = TorchTarget.from_gguf(path, dtype=torch.bfloat16, n_ctx=64)
    streamed = streamed_target(path, torch.bfloat16, from_ram=(0,), from_disk=(1,))
    prompt = [5, 17, 300, 42, 9, 120, 77]
    for target in (resident, streamed):
        target.prefill(prompt)
    tree = DraftTree(np.array([3, 50, 51, 60, 61]), np.array([-1, 0, 0, 1, 1]), np.zeros(5))
    for _ in range(3):
        logits = [t.forward_tree(tree) for t in (resident, streamed)]
        assert np.array_equal(logits[0], logits[1])
        for t in (resident, streamed):
            t.commit([0, 1, 4])
    assert streamed.streamer.collect_stats().passes == 4  # one prefill chunk + three trees
    streamed.streamer.close()


def test_real_layers_streamed_as_gguf_blocks_equal_resident(real_pair):
    """Two real Qwen2.5-1.5B layers (Q4_K / Q6_K): streamed as blocks == loaded by gguf's numpy."""
    real_1_5b = real_pair.target
    reader = gguf.GGUFReader(real_1_5b)
    args = dataclasses.replace(gguf_model_args(reader), n_layers=2)
    with torch.device("meta"):
        blocks = nn.ModuleList(TransformerBlock(args) for _ in range(2))
    tensors = {t.name: t for t in reader.tensors}
    state = {}
    for i, block in enumerate(blocks):
        params = dict(block.named_parameters())
        for param, name in LAYER_GGUF_NAMES(i).items():
            if param not in params:
                continue
            w = gguf.quants.dequantize(tensors[name].data, tensors[name].tensor_type)
            state[f"{i}.{param}"] = torch.from_numpy(np.require(w, np.float32, ["C", "W"])).to(torch.bfloat16)
    blocks.load_state_dict(state, assign=True)
    reference = copy.deepcopy(blocks)
    layouts = gguf_layouts(blocks, str(real_1_5b), LAYER_GGUF_NAMES)
    placement = fixed_placement(layouts, (), (0,), (1,))
    streamer = offload_blocks(blocks, placement, "cpu", layouts, model_path=str(real_1_5b))
    for stack in (blocks, reference):
        for block in stack:
            block.attention.kv_cache = KVCache(1, args.n_kv_heads, 8, args.head_dim, torch.bfloat16, "cpu")
    T = 4
    rope = rope_angles(rope_inv_freq(args), torch.arange(T)[None])
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    x = torch.randn(1, T, args.dim, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        outputs = [run_stack_with(stack, x, rope, mask) for stack in (blocks, reference)]
    assert torch.equal(outputs[0], outputs[1])
    streamer.close()


def run_stack_with(blocks, x, rope, mask):
    for block in blocks:
        x = block(x, rope, mask, 0)
    return x


# --- CUDA ------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("ring_slots", [2, 3])
def test_cuda_side_stream_prefetch_equals_resident(toy_gguf, ring_slots):
    reference = toy_stack_from_gguf(toy_gguf, torch.bfloat16).cuda()
    blocks = toy_stack_from_gguf(toy_gguf, torch.bfloat16)
    layouts = gguf_layouts(blocks, str(toy_gguf), toy_names)
    placement = fixed_placement(layouts, (2,), (0, 3, 5), (1, 4), ring_slots, "GPU")
    streamer = offload_blocks(blocks, placement, "cuda", layouts, model_path=str(toy_gguf), trace=True)
    assert streamer.order[0].host.is_pinned()
    with torch.inference_mode():
        for _ in range(5):
            x = torch.randn(4, 64, 256, dtype=torch.bfloat16, device="cuda")
            assert torch.equal(run_stack(blocks, x), run_stack(reference, x))
    stats = streamer.collect_stats()
    streamer.close()
    assert stats.passes == 5 and stats.bandwidth > 0 and stats.resyncs == 0
    consumed = [e.layer for e in streamer.trace if e.kind == "consume"]
    assert consumed == [0, 1, 3, 4, 5] * 5
