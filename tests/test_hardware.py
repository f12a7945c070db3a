"""Machine facts, bandwidth measurements, latency curves, and saved profiles (with fake backends)."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
from rich.console import Console

from ondevice.plan import profile as profile_store
from ondevice.machine.facts import machine_facts, measure_disk_read, measure_ram_bandwidth
from ondevice.plan.curve import LatencyCurve, pass_sizes
from ondevice.plan.latency import measure_drafter_curve, measure_target_curve
from ondevice.plan.profile import ProfileBackends, get_profile
from ondevice.decode.tree import DraftTree
from ondevice.decode.protocols import Target


def test_facts_are_sane():
    facts = machine_facts()
    assert facts.physical_cores >= 1 and facts.logical_cores >= facts.physical_cores
    assert 1 <= facts.usable_cores <= facts.logical_cores
    assert 0 < facts.ram_available <= facts.ram_total
    assert facts.disk_free > 0 and facts.cpu_model
    assert all(g.vram_total > 0 for g in facts.gpus)
    assert facts.fingerprint() == machine_facts().fingerprint()  # free RAM/disk don't change it


def test_ram_and_disk_bandwidth_are_positive(tmp_path):
    assert measure_ram_bandwidth(16 << 20, repeats=2) > 0
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).bytes(24 << 20))
    assert measure_disk_read(path, chunk=4 << 20) > 0
    assert measure_disk_read(path, max_bytes=5 << 20, chunk=4 << 20) > 0  # a partial read


@pytest.mark.cuda
def test_pinned_bandwidth_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from ondevice.machine.facts import measure_pinned_bandwidth

    h2d, d2h = measure_pinned_bandwidth(64 << 20)
    assert h2d > 0.5 and d2h > 0.5  # GB/s; PCIe 3 x16 gives ~12, a broken (pageable) path still > 0.5


def test_curve_interpolates_between_and_extrapolates_beyond():
    c = LatencyCurve((1, 4, 8), (0.10, 0.16, 0.32))
    assert c(1) == 0.10 and c(8) == 0.32
    assert c(2) == pytest.approx(0.12)  # 0.10 + (0.16 − 0.10)·(2 − 1)/(4 − 1)
    assert c(6) == pytest.approx(0.24)
    assert c(0.5) == 0.10  # flat below the first point
    assert c(16) == pytest.approx(0.64)  # last slope 0.04/token continues
    assert LatencyCurve((1, 8), (0.2, 0.1))(16) == pytest.approx(0.1)  # never extrapolates downward
    assert LatencyCurve.from_dict(c.to_dict()) == c
    noisy = LatencyCurve((1, 2, 4, 8), (0.30, 0.12, 0.20, 0.18))  # a busy CPU slowed n = 1 and n = 4
    assert noisy.padded().seconds == (0.12, 0.12, 0.18, 0.18)
    with pytest.raises(ValueError):
        LatencyCurve((4, 1), (0.1, 0.2))


class SleepyTarget(Target):
    """A protocols.Target whose pass over n nodes sleeps 1 ms + 0.1 ms per node."""

    n_vocab = 100

    def __init__(self, n_ctx: int = 200):
        self.n_ctx = n_ctx
        self.cache: list[int] = []
        self.pending: DraftTree | None = None
        self.passes: list[int] = []

    @property
    def n_cached(self) -> int:
        return len(self.cache)

    def truncate(self, n_tokens: int) -> None:
        del self.cache[n_tokens:]

    def prefill(self, tokens) -> None:
        self.cache.extend(int(t) for t in tokens)

    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        assert self.n_cached + len(tree) <= self.n_ctx
        time.sleep(0.001 + 0.0001 * len(tree))
        self.pending = tree
        self.passes.append(len(tree))
        return np.zeros((len(tree), self.n_vocab), dtype=np.float32)

    def commit(self, path) -> None:
        self.cache.extend(int(self.pending.tokens[i]) for i in path)


def test_target_curve_measures_chains_and_restores_the_cache():
    target = SleepyTarget(n_ctx=200)
    target.prefill([7, 8, 9])
    curve = measure_target_curve(target, context_tokens=64, sweeps=1, show=False)
    assert curve.ns == (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129)  # 2^k and 2^k + 1, capped by the room left: 200 − 3 − 64
    assert all(t > 0.001 for t in curve.seconds)
    assert curve(128) > curve(1)
    assert target.cache == [7, 8, 9]
    assert set(target.passes) == set(curve.ns)


def test_drafter_curve_calls_each_batch_size():
    calls = []
    curve = measure_drafter_curve(lambda n: (calls.append(n), time.sleep(0.002 * n)), batch_sizes=(1, 2, 4), sweeps=2, show=False)
    assert curve.ns == (1, 2, 4) and calls[0] == 1  # a warm-up call first
    assert curve(4) > curve(1) >= 0.002
    assert all(calls.count(n) >= 2 for n in (1, 2, 4))  # each size sampled in every sweep


@pytest.fixture(autouse=True)
def small_ram_copy(monkeypatch):
    """Profiles measure RAM with a 256 MiB copy; 8 MiB keeps these tests quick."""
    monkeypatch.setattr(profile_store, "measure_ram_bandwidth", lambda: measure_ram_bandwidth(8 << 20))


def fake_backends(model_file, counter: list[int]) -> ProfileBackends:
    def make_target():
        counter.append(1)
        return SleepyTarget(n_ctx=96)

    return ProfileBackends("fake-pair", "fake-cpu", [(model_file, None)], make_target, lambda: (lambda n: time.sleep(0.0005 * n)))


def test_profile_is_saved_reused_and_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    model_file = tmp_path / "target.gguf"
    model_file.write_bytes(b"\0" * (1 << 20))
    builds: list[int] = []
    backends = fake_backends(model_file, builds)
    first, reused = get_profile(backends, show=False)
    assert not reused and len(builds) == 1 and first.bandwidths.disk_read > 0
    assert first.curves.target.ns == (1, 2, 3, 4, 5, 8, 9, 16, 17, 32)
    again, reused = get_profile(backends, show=False)
    assert reused and len(builds) == 1 and again.curves == first.curves
    _, reused = get_profile(backends, refresh=True, show=False)
    assert not reused and len(builds) == 2
    model_file.write_bytes(b"\0" * (2 << 20))  # the model changed: measure again
    _, reused = get_profile(backends, show=False)
    assert not reused and len(builds) == 3


def test_profile_command_prints_tables_and_json(tmp_path, monkeypatch):
    from ondevice.cli.profile_cmd import show_profile

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    model_file = tmp_path / "target.gguf"
    model_file.write_bytes(b"\0" * (1 << 20))
    backends = fake_backends(model_file, [])
    text = io.StringIO()
    show_profile(backends, out=Console(file=text, width=200))
    assert "latency: fake-pair" in text.getvalue() and "plan:" in text.getvalue()
    text = io.StringIO()
    show_profile(backends, as_json=True, out=Console(file=text, width=200))
    record = json.loads(text.getvalue())
    assert record["reused"] and record["pair"] == "fake-pair"
    assert record["curves"]["target"]["ns"] == list(pass_sizes(32)) and "plan" in record
