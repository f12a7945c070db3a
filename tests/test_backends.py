"""Backend choice: the profile measures every backend's curves (loaded first, the others when
compared), keeps them, and auto picks the pair with the fastest predicted plan — never one it has
not measured. Real tiny models through the pipeline; timing-free (curves are written, not timed,
where the choice itself is tested)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ondevice import pipeline
from ondevice.loading import choices, options
from ondevice.errors import OndeviceError
from ondevice.plan import profile as profile_store
from ondevice.plan.backends import backend_options, best_backends
from ondevice.machine.facts import Bandwidths, machine_facts, measure_ram_bandwidth
from ondevice.plan.curve import LatencyCurve
from ondevice.plan.profile import Profile, ProfileBackends, get_profile, save_profile
from tiny_models import write_tiny_pair

from test_hardware import SleepyTarget


def curve(points: dict[int, float]) -> LatencyCurve:
    return LatencyCurve(tuple(points), tuple(points.values()))


STEEP = curve({1: 0.050, 2: 0.090, 4: 0.160, 8: 0.300, 16: 0.600})  # llama.cpp-like: a pass costs ~n steps
FLAT = curve({1: 0.045, 2: 0.050, 4: 0.060, 8: 0.080, 16: 0.140})  # ONNX-like: blocks reused across the pass
SLOW_DRAFT, FAST_DRAFT = curve({1: 0.025, 16: 0.200, 64: 0.800}), curve({1: 0.012, 16: 0.050, 64: 0.190})
P_RANK = np.array([0.7, 0.1, 0.05, 0.03])


@pytest.fixture(autouse=True)
def small_ram_copy(monkeypatch):
    monkeypatch.setattr(profile_store, "measure_ram_bandwidth", lambda: measure_ram_bandwidth(8 << 20))


def fake_profile(targets: dict, drafters: dict) -> Profile:
    return Profile("tiny", "cpu-t2", machine_facts(), Bandwidths(1.0), None, [], targets=targets, drafters=drafters)


def test_auto_takes_the_fastest_measured_pair_and_only_measured_ones():
    both = fake_profile({"llama": STEEP, "onnx": FLAT}, {"llama": SLOW_DRAFT, "onnx": FAST_DRAFT})
    best = best_backends(both, P_RANK)
    assert (best.target, best.drafter) == ("onnx", "onnx") and best.plan.budget > 0
    options = backend_options(both, P_RANK)
    assert len(options) == 4 and [o.tokens_per_second for o in options] == sorted((o.tokens_per_second for o in options), reverse=True)
    assert best_backends(both, P_RANK, target="llama").target == "llama"  # a fixed side stays fixed
    slower_onnx = fake_profile({"llama": FLAT, "onnx": STEEP}, {"llama": FAST_DRAFT, "onnx": SLOW_DRAFT})
    assert (best_backends(slower_onnx, P_RANK).target, best_backends(slower_onnx, P_RANK).drafter) == ("llama", "llama")
    assert best_backends(fake_profile({"llama": STEEP}, {"llama": SLOW_DRAFT}), P_RANK, target="onnx") is None  # onnx never measured
    barely = curve({n: t * 0.97 for n, t in zip(STEEP.ns, STEEP.seconds)})  # 3% faster: within a profile's noise
    close = fake_profile({"llama": STEEP, "onnx": barely}, {"llama": SLOW_DRAFT})
    assert backend_options(close, P_RANK)[0].target == "onnx" and best_backends(close, P_RANK).target == "llama"
    assert best_backends(None, P_RANK) is None


def test_profile_measures_the_loaded_backends_then_adds_the_others_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    model_file = tmp_path / "target.gguf"
    model_file.write_bytes(b"\0" * (1 << 20))
    built: list[str] = []

    def target(name):
        return lambda: built.append(name) or SleepyTarget(n_ctx=96)

    def broken():
        raise OndeviceError("this file has a type the backend cannot read")

    backends = ProfileBackends(
        "fake-pair", "llama-cpu-t2", [(model_file, None)], target("llama"), lambda: (lambda n: time.sleep(0.0002 * n)),
        target_name="llama", drafter_name="llama", other_targets={"onnx": target("onnx"), "torch": broken},
        other_drafters={"onnx": lambda: (lambda n: time.sleep(0.0001 * n))}, key="cpu-t2",
    )  # fmt: skip
    first, reused = get_profile(backends, show=False)
    assert not reused and built == ["llama"] and set(first.targets) == {"llama"} and set(first.drafters) == {"llama"}
    compared, reused = get_profile(backends, show=False, compare=True)  # adds what is missing, keeps the rest
    assert not reused and built == ["llama", "onnx"] and set(compared.targets) == {"llama", "onnx"}
    assert set(compared.drafters) == {"llama", "onnx"} and "target torch" in compared.skipped
    assert compared.targets["llama"] == first.targets["llama"] and compared.curves == first.curves
    again, reused = get_profile(backends, show=False, compare=True)
    assert reused and built == ["llama", "onnx"]
    assert (tmp_path / "profiles").glob("*-fake-pair-cpu-t2.json")


def test_pipeline_loads_the_backends_the_profile_found_fastest(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    opts = options.LoadOptions(model="tiny", threads=1, ctx=256)
    backends = choices.load_backends(opts)
    assert (backends.target_name, backends.drafter_name) == ("llama", "llama")  # nothing measured yet: llama.cpp
    assert set(backends.other_targets) == {"onnx"} and set(backends.other_drafters) == {"onnx"} and backends.key == "cpu-t1"
    saved = fake_profile({"llama": STEEP, "onnx": FLAT}, {"llama": SLOW_DRAFT, "onnx": FAST_DRAFT})
    saved.pair, saved.backend, saved.curves = "tiny", "cpu-t1", saved.curves_for("llama", "llama")
    saved.model_files = [profile_store.file_identity(p, sha) for p, sha in backends.model_files]
    save_profile(saved)
    with pipeline.load_pipeline(opts) as pipe:
        assert pipe.target_backend == "onnx" and pipe.info["drafter_backend"] == "onnx"
        assert type(pipe.engine.target).__name__ == "OnnxTarget"
        assert type(pipe.engine.drafter.model).__name__ == "OnnxDrafter"
    with pipeline.load_pipeline(options.LoadOptions(model="tiny", threads=1, ctx=256, drafter_backend="llama")) as pipe:
        assert pipe.target_backend == "onnx" and pipe.info["drafter_backend"] == "llama"  # the target still auto


def test_unknown_drafter_backend_is_one_clear_error():
    with pytest.raises(OndeviceError, match="drafter backend 'tpu'"):
        options.LoadOptions(drafter_backend="tpu").checked()


def test_bench_compares_backend_pairs_in_one_run(tmp_path):
    """`ondevice bench --backends`: the curves of every backend, then each configuration on each pair."""
    import json
    import os
    import subprocess
    import sys

    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    env = {**os.environ, "ONDEVICE_HOME": str(tmp_path)}
    args = ["bench", "-m", "tiny", "--threads", "1", "--ctx", "256", "--backends", "llama/llama,onnx/onnx",
            "--trees", "chain", "--budgets", "2", "--limit", "1", "-n", "8", "--json"]  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["backends"] == ["llama/llama", "onnx/onnx"]
    assert [r["config"] for r in report["results"]] == ["llama/llama: target only", "llama/llama: chain @2", "onnx/onnx: target only", "onnx/onnx: chain @2"]
    assert set(report["curves"]["targets"]) == {"llama", "onnx"} and set(report["curves"]["drafters"]) == {"llama", "onnx"}
    assert all(r["tokens"] == 8 for r in report["results"])
