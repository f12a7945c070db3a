"""A pipeline whose target does not fit the RAM it may use, end to end on a tiny pair: the memory
plan streams the target (mapped, unrepacked, page cache steered), keeps the drafter resident and
sizes the buffers; the answers equal those of the same pair in RAM, and `stats_json` reports the
placement, the footprint and the bytes read per pass."""

from __future__ import annotations

import pytest

import ondevice
from ondevice import pipeline
from ondevice.plan import ram
from ondevice.plan.memory import MARGIN, ModelSize, plan_memory
from ondevice.protocols import DraftSpec
from tiny_models import write_tiny_pair

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture
def tiny_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    return tmp_path


def answer(pipe, spec):
    records = list(pipe.stream(MESSAGES, max_tokens=24, spec=spec))
    return [t for r in records for t in r.token_ids], records[-1].stats


def test_a_target_that_does_not_fit_streams_and_answers_the_same(tiny_home, monkeypatch):
    spec = DraftSpec("best-first", 8)
    with ondevice.load("tiny", target_backend="llama", threads=1, n_ctx=256) as pipe:
        assert pipe.memory.target_in_ram and pipe.engine.target.window is None
        in_ram, _ = answer(pipe, spec)
    # a budget that holds everything but the target's weights: it must stream
    models = tiny_home / "models"
    target, drafter = ModelSize.from_gguf(models / "tiny-target.gguf"), ModelSize.from_gguf(models / "tiny-drafter.gguf")
    fits = plan_memory(target, drafter, n_ctx=256)
    budget = fits.resident_bytes + target.working_bytes + MARGIN - 1
    monkeypatch.setattr(pipeline, "ram_budget", lambda: ram.RamBudget(budget, "test"))
    with ondevice.load("tiny", target_backend="llama", threads=1, n_ctx=256) as pipe:
        assert pipe.memory.streams and pipe.memory.sizes.max_tree <= 64
        assert pipe.engine.target.window is not None and pipe.engine.drafter.model.model.resident
        assert "streams from disk" in pipe.placement
        streamed, stats = answer(pipe, spec)
        report = pipe.stats_json(stats)
    assert streamed == in_ram
    assert report["placement"]["placement"] == "disk" and report["bytes_streamed_per_pass"] > 0
    assert report["peak_rss_bytes"] > 0 and "bytes_read_per_pass" in report
