"""Stats.cpu_busy_cores: the cores the process kept busy while decoding, beside the round split.

The reference is what each fake pass does by construction: a pass that computes (a busy loop on its
thread) keeps one core busy for its length, a pass that waits (a sleep, as a streamed pass waiting
for the disk) keeps none. The target underneath is a tiny llama.cpp model on one thread, whose own
passes take a few milliseconds of the 40 ms each pass adds.
"""

from __future__ import annotations

import time

import pytest

from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from tiny_models import write_tiny_gguf

PASS_SECONDS = 0.04


class TimedTarget:
    """The tiny target, each pass made PASS_SECONDS longer by computing or by waiting."""

    def __init__(self, inner, computes: bool):
        self.inner, self.computes = inner, computes

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_tree(self, tree):
        if self.computes:
            end = time.perf_counter() + PASS_SECONDS
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(PASS_SECONDS)
        return self.inner.forward_tree(tree)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from ondevice.targets.llama_target import LlamaTarget

    path = write_tiny_gguf(tmp_path_factory.mktemp("cpu") / "target.gguf", arch="llama")
    target = LlamaTarget(path, n_ctx=128, threads=1)
    yield target
    target.close()


@pytest.mark.parametrize("computes", [True, False], ids=["computing", "waiting"])
def test_cpu_busy_cores_counts_a_pass_that_computes_and_not_one_that_waits(tiny_target, computes):
    engine = SpecEngine(TimedTarget(tiny_target, computes), None, lambda token: False)
    tokens, stats = collect(engine.generate([5, 60, 61, 7], 12))
    assert len(tokens) == 12 and stats.cpu_seconds is not None
    if computes:
        assert 0.6 <= stats.cpu_busy_cores <= 1.5  # one thread busy nearly the whole time (a busy VM steals some)
    else:
        assert stats.cpu_busy_cores <= 0.35  # asleep for most of each pass
    assert stats.to_json()["cpu_busy_cores"] == stats.cpu_busy_cores
