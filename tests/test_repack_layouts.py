"""machine/repack_layouts.py: on a CPU with AMX, whose AMX kernels stay off unless asked for, a load
that may repack still gets llama.cpp's CPU_REPACK layouts, asked for weight by weight, and exactly
for the weights that buffer type takes here; llama-cpp-python's own `Llama()` is given the same."""

from __future__ import annotations

import re

import llama_cpp
import pytest

import tiny_models
from ondevice import llama_backend
from ondevice.files.gguf_header import read_header
from ondevice.machine import llama_repack, repack_layouts
from ondevice.machine.repack_layouts import TensorOverride, layouts_repacked, repack_overrides, repacked_names
from tiny_quant import QUANT_DIMS, q4_k_m_mix


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    dims = dict(tiny_models.DIMS)
    tiny_models.DIMS.update(QUANT_DIMS)
    try:
        path = tiny_models.write_tiny_gguf(tmp_path_factory.mktemp("layouts") / "q.gguf", "llama", quantize=q4_k_m_mix)
    finally:
        tiny_models.DIMS.clear()
        tiny_models.DIMS.update(dims)
    if not layouts_repacked() or not repacked_names(path):
        pytest.skip("llama.cpp has no repacked layout for these weights on this CPU")
    return path


@pytest.fixture
def amx_not_asked(monkeypatch):
    """A CPU with AMX whose AMX kernels were not asked for (ONDEVICE_AMX unset): the default there."""
    monkeypatch.setattr(llama_repack, "cpu_has_amx", lambda: True)
    monkeypatch.delenv("ONDEVICE_AMX", raising=False)


def matched(entries, names) -> list[str]:
    """The names some override pattern matches (llama.cpp's std::regex_search, ECMAScript: the same
    as Python's re for these patterns), up to the NULL entry that ends the array."""
    patterns = []
    for entry in entries:
        if entry.pattern is None:
            break
        patterns.append(re.compile(entry.pattern.decode()))
    return [n for n in names if any(p.search(n) for p in patterns)]


def test_the_overrides_name_exactly_the_weights_cpu_repack_takes(quantized):
    array = repack_overrides(quantized)
    names = list(read_header(quantized).tensors)
    assert matched(array, names) == repacked_names(quantized) != []
    assert array[len(array) - 1].pattern is None and not array[len(array) - 1].buft  # NULL-terminated
    assert {entry.buft for entry in list(array)[:-1]} == {repack_layouts.repack_buffer_type()}


def buffers(path, **kwargs) -> str:
    with llama_backend.capture_llama_log() as lines:
        model = llama_backend.LlamaModel(path, **kwargs)
    model.close()
    return "".join(lines)


def test_an_amx_cpu_computes_the_repacked_weights_without_the_amx_buffer(quantized, amx_not_asked):
    log = buffers(quantized, resident=True)
    assert "CPU_REPACK model buffer size" in log and "AMX" not in log, log
    assert "CPU_REPACK" not in buffers(quantized, resident=True, repack=False)  # a target that must stay mapped


def test_llama_cpp_python_is_given_the_same_layout(quantized, amx_not_asked):
    with repack_layouts.weight_layout_guard(quantized):
        params = llama_cpp.llama_cpp.llama_model_default_params()
        assert params.use_extra_bufts is False and params.tensor_buft_overrides
        entries = (TensorOverride * len(repack_overrides(quantized))).from_address(params.tensor_buft_overrides)
        assert matched(entries, list(read_header(quantized).tensors)) == repacked_names(quantized)
    with repack_layouts.weight_layout_guard(None):  # no model: the weights as the file stores them
        params = llama_cpp.llama_cpp.llama_model_default_params()
        assert params.use_extra_bufts is False and not params.tensor_buft_overrides
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True  # restored
