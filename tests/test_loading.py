"""Loading is planned once: a load of a tiny pair reads each GGUF header once and computes its memory
plan once, whether the backends are asked for or chosen (real llama.cpp models, temp ONDEVICE_HOME)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ondevice
from ondevice.loading import options
from ondevice.loading import plan as load_plan
from ondevice.loading.footprint import ModelSize
from tiny_models import write_tiny_pair


@pytest.fixture
def tiny_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    return tmp_path


@pytest.fixture
def counted(monkeypatch):
    """The memory plans computed and the GGUF headers read for a plan, as they happen."""
    plans, headers = [], []
    plan_memory, from_gguf = load_plan.plan_memory, ModelSize.from_gguf.__func__

    def counted_plan(*args, **kwargs):
        plans.append(args)
        return plan_memory(*args, **kwargs)

    def counted_header(cls, path):
        headers.append(Path(path).name)
        return from_gguf(cls, path)

    monkeypatch.setattr(load_plan, "plan_memory", counted_plan)
    monkeypatch.setattr(ModelSize, "from_gguf", classmethod(counted_header))
    return plans, headers


@pytest.mark.parametrize("backends", [{"target_backend": "llama", "drafter_backend": "llama"}, {}])
def test_a_load_plans_its_memory_once_and_reads_each_header_once(tiny_home, counted, backends):
    plans, headers = counted
    with ondevice.load("tiny", threads=1, ctx=256, **backends) as pipe:
        assert pipe.target_backend == "llama" and pipe.memory is not None and pipe.memory.target_in_ram
        assert pipe.memory.sizes.n_ctx == pipe.engine.target.n_ctx == 256
    assert len(plans) == 1
    assert sorted(headers) == ["tiny-drafter.gguf", "tiny-target.gguf"]


def test_answer_data_is_not_a_load_option():
    fields = set(options.LoadOptions.__dataclass_fields__)
    assert not fields & {"prompts", "max_tokens"}  # they go to load_pipeline as `Answers`, only to size a streaming target's context
