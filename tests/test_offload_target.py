"""The offloaded PyTorch target computes exactly what the resident one computes.

The reference is `TorchTarget.from_gguf` of the same file and dtype: every layer dequantized on the
host by gguf's numpy code. The offloaded target keeps a few layers resident and streams the others
as GGUF blocks (from RAM, or from disk), dequantized on the device; logits must be equal, bit for
bit, over a prefill, several tree passes and commits. On this CPU-only machine the "device" is the
CPU; the CUDA variant runs the same comparison on a GPU when there is one.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tiny_models
from ondevice.errors import OndeviceError
from ondevice.targets import offloaded as offload_target
from ondevice.targets.offloaded import load_offloaded_target, plan_offload
from ondevice.paths import models_dir
from ondevice.targets import weights
from ondevice.targets.torch_target import TorchTarget
from ondevice.decode.tree import DraftTree

N_LAYERS = 8  # tiny models with more layers than tiny_models' default, so a few can stay resident
N_CTX = 64
REAL_1_5B = models_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


TINY = [
    ("qwen2", "f32", torch.float32),  # tied head shared with the embeddings
    ("qwen2", "f16", torch.bfloat16),  # tied head copied in fp32 (head_dtype)
    ("llama", "f16", torch.bfloat16),  # own head; Q/K rows unpermuted after each transfer
]


@pytest.fixture(scope="module", params=TINY, ids=lambda p: f"{p[0]}-{p[1]}-{str(p[2])[6:]}")
def tiny(request, tmp_path_factory):
    """(path, dtype) of an 8-layer tiny GGUF: qwen2 (tied head, biases) or llama (llama3 RoPE)."""
    arch, file_dtype, dtype = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tiny_models.DIMS, "num_hidden_layers", N_LAYERS)
        path = tiny_models.write_tiny_gguf(tmp_path_factory.mktemp(arch) / f"{arch}-{file_dtype}.gguf", arch, dtype=file_dtype)
    return path, dtype


def budgets(path, dtype, on_device: int, in_ram: int | None = None, device="cpu") -> dict:
    """gpu_memory / ram_memory that keep `on_device` layers resident and `in_ram` streamed ones in
    RAM, following the memory model of placement.py (the tiny layers are all the same size)."""
    plan = plan_offload(path, device, dtype, N_CTX, "1TB", "1TB")
    decoded = max(layout.decoded_bytes for layout in plan.layouts.values())
    moved = max(layout.nbytes for layout in plan.layouts.values())
    floor = plan.resident_bytes + 2 * moved + decoded  # two ring slots and one decoded layer
    ram = "1TB" if in_ram is None else 2 * moved + in_ram * moved  # two disk staging buffers
    return dict(gpu_memory=floor + on_device * decoded, ram_memory=ram)


def run_and_compare(resident: TorchTarget, offloaded: TorchTarget, passes: int = 4) -> None:
    """Prefill, then tree passes with commits of varying paths: logits equal at every pass."""
    prompt = [5, 17, 300, 42, 9, 120, 77, 1, 250]
    for target in (resident, offloaded):
        target.prefill(prompt)
    tree = DraftTree(np.array([3, 50, 51, 60, 61, 7]), np.array([-1, 0, 0, 1, 1, 2]), np.zeros(6))
    for path in ([0, 1, 4], [0, 2, 5], [0], [0, 1, 3])[:passes]:
        logits = [target.forward_tree(tree) for target in (resident, offloaded)]
        assert np.array_equal(logits[0], logits[1])
        for target in (resident, offloaded):
            target.commit(path)
    assert resident.n_cached == offloaded.n_cached


def test_streamed_from_ram_equals_resident(tiny):
    path, dtype = tiny
    resident = TorchTarget.from_gguf(path, dtype=dtype, n_ctx=N_CTX)
    offloaded = load_offloaded_target(path, "cpu", dtype, N_CTX, **budgets(path, dtype, on_device=2))
    placement = offloaded.placement
    assert len(placement.on_device) == 2 and len(placement.from_ram) == 6 and placement.from_disk == ()
    run_and_compare(resident, offloaded)
    stats = offloaded.streamer.collect_stats()
    assert stats.passes == 5 and stats.resyncs == 0  # one prefill chunk, four trees
    assert stats.bytes_per_pass == placement.bytes_per_pass and stats.bandwidth > 0
    summary = offloaded.placement_summary()
    assert summary.startswith(placement.describe()) and "per pass at" in summary and "\n" not in summary
    offloaded.close()


def test_ram_and_disk_tiers_equal_resident(tiny):
    path, dtype = tiny
    resident = TorchTarget.from_gguf(path, dtype=dtype, n_ctx=N_CTX)
    offloaded = load_offloaded_target(path, "cpu", dtype, N_CTX, **budgets(path, dtype, on_device=1, in_ram=3))
    placement = offloaded.placement
    assert len(placement.on_device) == 1 and len(placement.from_ram) == 3 and len(placement.from_disk) == 4
    run_and_compare(resident, offloaded)
    stats = offloaded.streamer.collect_stats()
    disk_per_pass = placement.disk_bytes_per_pass
    assert stats.disk_bytes_read >= 5 * disk_per_pass  # every pass reads its disk layers again
    assert "disk" in offloaded.placement_summary()
    offloaded.close()


def test_streamed_layers_are_never_dequantized_on_the_host(tiny, monkeypatch):
    path, dtype = tiny
    dequantized = []
    real = weights._dequantize
    monkeypatch.setattr(weights, "_dequantize", lambda tensor: dequantized.append(tensor.name) or real(tensor))
    offloaded = load_offloaded_target(path, "cpu", dtype, N_CTX, **budgets(path, dtype, on_device=2))
    layers = {int(name.split(".")[1]) for name in dequantized if name.startswith("blk.")}
    assert layers == set(offloaded.placement.on_device)
    assert {"token_embd.weight", "output_norm.weight"} <= set(dequantized)
    offloaded.close()


def test_everything_fitting_streams_nothing(tiny):
    path, dtype = tiny
    resident = TorchTarget.from_gguf(path, dtype=dtype, n_ctx=N_CTX)
    offloaded = load_offloaded_target(path, "cpu", dtype, N_CTX, gpu_memory="1GB", ram_memory="1GB")
    assert offloaded.streamer is None and offloaded.placement.on_device == tuple(range(N_LAYERS))
    run_and_compare(resident, offloaded, passes=2)


# --- errors a user can cause: one line, before anything is dequantized ---------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gpu_memory="100kB"), "CPU memory budget .* is below"),
        (dict(gpu_memory="1GB", ram_memory="lots"), "Cannot read the size"),
    ],
)
def test_bad_budgets_fail_early_in_one_line(tiny, monkeypatch, kwargs, message):
    path, dtype = tiny
    monkeypatch.setattr(weights, "_dequantize", lambda tensor: pytest.fail("dequantized before planning failed"))
    with pytest.raises(OndeviceError, match=message) as err:
        load_offloaded_target(path, "cpu", dtype, N_CTX, **kwargs)
    assert "\n" not in str(err.value)


def test_ram_below_disk_staging_fails_early(tiny, monkeypatch):
    path, dtype = tiny
    kwargs = budgets(path, dtype, on_device=0)
    monkeypatch.setattr(weights, "_dequantize", lambda tensor: pytest.fail("dequantized before planning failed"))
    with pytest.raises(OndeviceError, match="RAM budget .* is below"):
        load_offloaded_target(path, "cpu", dtype, N_CTX, gpu_memory=kwargs["gpu_memory"], ram_memory="1kB")


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(OndeviceError, match="No GGUF file at"):
        load_offloaded_target(tmp_path / "gone.gguf", "cpu", gpu_memory="1GB")


def test_model_file_vanishing_after_planning_is_one_line(tiny, tmp_path, monkeypatch):
    path, dtype = tiny
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(path.read_bytes())
    real = offload_target.offload_blocks

    def vanish_then_offload(*args, **kwargs):  # the resident weights are loaded, the file goes away
        os.remove(copy)
        return real(*args, **kwargs)

    monkeypatch.setattr(offload_target, "offload_blocks", vanish_then_offload)
    with pytest.raises(OndeviceError, match="Cannot read the layers to stream") as err:
        load_offloaded_target(copy, "cpu", dtype, N_CTX, **budgets(path, dtype, on_device=2))
    assert "\n" not in str(err.value)


def test_model_file_vanishing_under_the_disk_tier_is_one_line(tiny, tmp_path):
    path, dtype = tiny
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(path.read_bytes())
    offloaded = load_offloaded_target(copy, "cpu", dtype, N_CTX, **budgets(copy, dtype, on_device=1, in_ram=0))
    offloaded.prefill([1, 2, 3])
    os.remove(copy)
    with pytest.raises(OndeviceError, match="vanished or was replaced") as err:
        for _ in range(3):  # reads already in flight may still succeed
            offloaded.prefill([4, 5])
    assert "\n" not in str(err.value)
    offloaded.close()


# --- CUDA ---------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("in_ram", [None, 3], ids=["ram", "ram+disk"])
def test_cuda_offloaded_equals_resident(tiny, in_ram):
    path, dtype = tiny
    dtype = torch.bfloat16 if dtype == torch.float32 else torch.float32  # the other dtype than on CPU
    resident = TorchTarget.from_gguf(path, "cuda", dtype, n_ctx=N_CTX)
    kwargs = budgets(path, dtype, on_device=1, in_ram=in_ram, device="cuda")
    offloaded = load_offloaded_target(path, "cuda", dtype, N_CTX, **kwargs)
    assert len(offloaded.placement.streamed) == N_LAYERS - 1 and "on GPU" in offloaded.placement_summary()
    assert offloaded.streamer.order[0].host is None or offloaded.streamer.order[0].host.is_pinned()
    run_and_compare(resident, offloaded)
    assert offloaded.streamer.collect_stats().bandwidth > 0
    offloaded.close()


# --- the real 1.5B ------------------------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.skipif(not REAL_1_5B.is_file(), reason="the real 1.5B GGUF is not downloaded")
def test_real_1_5b_streaming_three_quarters_equals_resident():
    """Qwen2.5-Coder-1.5B Q4_K_M, fp32 on CPU: 7 of 28 layers resident, 21 streamed as Q4_K/Q6_K."""
    prompt = [151644, 872, 198, 7985, 264, 13027, 729, 429, 16, 17, 18, 13]
    chain = DraftTree(np.array([198, 750, 1932, 1445, 1155, 982, 262, 470]), np.arange(-1, 7), np.zeros(8))
    resident = TorchTarget.from_gguf(REAL_1_5B, n_ctx=N_CTX)
    resident.prefill(prompt)
    expected = resident.forward_tree(chain)
    del resident  # one model in memory at a time

    plan = plan_offload(REAL_1_5B, "cpu", torch.float32, N_CTX, "1TB", "1TB")
    decoded = max(layout.decoded_bytes for layout in plan.layouts.values())
    moved = max(layout.nbytes for layout in plan.layouts.values())
    budget = plan.resident_bytes + 2 * moved + decoded + 7 * decoded
    offloaded = load_offloaded_target(REAL_1_5B, "cpu", torch.float32, N_CTX, gpu_memory=budget, ram_memory="8GB")
    assert len(offloaded.placement.streamed) >= 21
    offloaded.prefill(prompt)
    assert np.array_equal(offloaded.forward_tree(chain), expected)
    offloaded.close()
