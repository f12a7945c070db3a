"""A model split into parts (`…-00001-of-0000N.gguf`) computes exactly what the same model in one file does.

The tiny model is written twice by gguf-py's writer: once as one file, once split with at most 9
tensors per part (llama.cpp's names and split.* keys). References: the one-file model through the
same backend. Through llama.cpp (which loads a set from its first part), our torch target (weights
read across parts) and the offloaded torch target (layers streamed from RAM and read from disk,
each layer's byte ranges in whichever part holds them), the logits are bit-identical.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tiny_models
from test_offload_target import budgets, run_and_compare
from test_torch_target import llama_cpp_logits

from ondevice.errors import OndeviceError
from ondevice.files.gguf_reader import SplitReader
from ondevice.files.gguf_split import part_paths
from ondevice.offload.layout import gguf_tensor_index
from ondevice.targets.offloaded import load_offloaded_target
from ondevice.targets.torch_target import TorchTarget

N_LAYERS, N_CTX = 6, 64


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def models(request, tmp_path_factory):
    """(one file, first part of the split set) of the same 6-layer tiny model."""
    folder = tmp_path_factory.mktemp("split")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tiny_models.DIMS, "num_hidden_layers", N_LAYERS)
        whole = tiny_models.write_tiny_gguf(folder / "whole.gguf", request.param, seed=4)
        first = tiny_models.write_tiny_gguf(folder / "split.gguf", request.param, seed=4, split_max_tensors=9)
    return whole, first


def test_the_set_is_several_parts_holding_every_tensor(models):
    whole, first = models
    parts = part_paths(first)
    assert first.name == f"split-00001-of-{len(parts):05d}.gguf" and len(parts) >= 4
    index = gguf_tensor_index(first)
    assert {info.part for info in index.values()} == set(range(len(parts)))
    assert set(index) == set(gguf_tensor_index(whole))


def test_llama_cpp_loads_the_set(models):
    whole, first = models
    tokens = np.random.default_rng(0).integers(0, 319, 24).tolist()
    np.testing.assert_array_equal(llama_cpp_logits(first, tokens), llama_cpp_logits(whole, tokens))


def test_torch_target_reads_across_parts(models):
    whole, first = models
    run_and_compare(TorchTarget.from_gguf(whole, dtype=torch.float32, n_ctx=N_CTX), TorchTarget.from_gguf(first, dtype=torch.float32, n_ctx=N_CTX))


def test_offloaded_layers_stream_from_ram_and_disk_across_parts(models):
    whole, first = models
    resident = TorchTarget.from_gguf(whole, dtype=torch.float32, n_ctx=N_CTX)
    offloaded = load_offloaded_target(first, "cpu", torch.float32, N_CTX, **budgets(first, torch.float32, on_device=1, in_ram=2))
    placement = offloaded.placement
    assert len(placement.from_ram) == 2 and len(placement.from_disk) == 3
    run_and_compare(resident, offloaded)
    offloaded.close()


def test_a_missing_part_is_one_line(models, tmp_path):
    _, first = models
    for part in part_paths(first)[:-1]:  # copy all but the last part
        (tmp_path / part.name).write_bytes(part.read_bytes())
    with pytest.raises(OndeviceError, match=r"No GGUF file at .*-of-.*\(1 of \d+ parts missing\)") as caught:
        SplitReader(tmp_path / first.name)
    assert "\n" not in str(caught.value)
