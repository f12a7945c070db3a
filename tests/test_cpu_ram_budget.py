"""On a CPU, --ram-memory is all the memory the torch target may use: what does not fit streams from
disk (never every layer in RAM whatever the budget)."""

from __future__ import annotations

import pytest
import torch

import tiny_models
from ondevice.targets.offloaded import load_offloaded_target, plan_offload
from ondevice.targets.torch_target import TorchTarget
from test_offload_target import N_CTX, N_LAYERS, run_and_compare


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tiny_models.DIMS, "num_hidden_layers", N_LAYERS)
        return tiny_models.write_tiny_gguf(tmp_path_factory.mktemp("cpu-ram") / "tiny.gguf", "qwen2", dtype="f32")


@pytest.mark.parametrize("resident_layers", [0, 3])
def test_a_ram_budget_on_a_cpu_streams_the_rest_from_disk(tiny, resident_layers):
    unlimited = plan_offload(tiny, "cpu", torch.float32, N_CTX, None, "1TB")
    decoded = max(layout.decoded_bytes for layout in unlimited.layouts.values())
    moved = max(layout.nbytes for layout in unlimited.layouts.values())
    floor = unlimited.resident_bytes + 2 * moved + decoded  # ring slots and one decoded layer
    budget = floor + resident_layers * decoded + 2 * moved  # and the disk tier's two staging buffers
    offloaded = load_offloaded_target(tiny, "cpu", torch.float32, N_CTX, ram_memory=budget)
    placement = offloaded.placement
    assert len(placement.on_device) == resident_layers and placement.from_ram == ()
    assert len(placement.from_disk) == N_LAYERS - resident_layers
    assert placement.device_bytes + placement.ram_bytes <= budget  # the budget means what it says
    run_and_compare(TorchTarget.from_gguf(tiny, dtype=torch.float32, n_ctx=N_CTX), offloaded)
    offloaded.close()


def test_a_ram_budget_that_holds_everything_streams_nothing(tiny):
    offloaded = load_offloaded_target(tiny, "cpu", torch.float32, N_CTX, ram_memory="1GB")
    assert offloaded.streamer is None and offloaded.placement.on_device == tuple(range(N_LAYERS))


def test_a_ram_budget_below_the_minimum_is_one_line_naming_it(tiny):
    from ondevice.errors import OndeviceError

    with pytest.raises(OndeviceError, match=r"^--ram-memory 1.0 kB is below the .* this target needs in RAM"):
        load_offloaded_target(tiny, "cpu", torch.float32, N_CTX, ram_memory=1000)
