"""Predicted speed before download: from cached synthetic curves through the planner's cost model,
nothing invented when a curve is missing, and what `ondevice bench` measured shown beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ondevice.catalog.pairs import list_pairs, load_pair
from ondevice.bench.runner import BenchResult
from ondevice.bench.measured import record_bench
from ondevice.decode.engine import Stats
from ondevice.loading.options import LoadOptions
from ondevice.synthetic.forecast import forecast, forecast_measured, plan_config
from ondevice.machine.facts import default_threads, machine_facts
from ondevice.plan.curve import LatencyCurve
from ondevice.synthetic.cache import SyntheticMeasurement, Traffic, save_measurement


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    return tmp_path


def cache_curve(shape: str, role: str, backend: str, seconds) -> None:
    ns = tuple(1 << i for i in range(len(seconds)))
    save_measurement(machine_facts().fingerprint(), SyntheticMeasurement(
        shape, role, backend, "", "all layers on CPU (llama.cpp)", LatencyCurve(ns, tuple(seconds)), Traffic(1, "RAM", "RAM copy", 1.0), 1, 0))  # fmt: skip


def test_nothing_is_predicted_before_the_curves_are_measured(home):
    f = forecast(load_pair("qwen2.5-72b"), LoadOptions(target_backend="llama"))
    assert f.alone is None and f.speculative is None and f.target is None
    assert f.to_measure == "ondevice bench --synthetic qwen2.5-72b --target-backend llama"


def test_flat_target_curve_predicts_speculation_above_the_target_alone(home):
    """A target whose pass costs 100 ms at 1 to 64 tokens (an offloaded one) and a 5 ms drafter:
    alone is exactly 10 tok/s; a draft tree emits several tokens per pass for little more time."""
    backend = f"llama-cpu-t{default_threads()}"
    cache_curve("qwen2.5-72b", "target", backend, [0.1] * 7)
    cache_curve("qwen2.5-0.5b", "drafter", backend, [0.005] * 8)
    f = forecast(load_pair("qwen2.5-72b"), LoadOptions(target_backend="llama"))
    assert f.alone == pytest.approx(10.0)
    assert f.speculative.predicted_tokens_per_pass > 3 and f.speculative.predicted_tokens_per_second > 2 * f.alone
    assert f.planner == f.speculative  # worth it: --tree auto would draft


def test_bench_measurements_are_shown_beside_the_prediction(home):
    backend = f"llama-cpu-t{default_threads()}"
    cache_curve("qwen2.5-coder-1.5b", "target", backend, [0.05, 0.09, 0.16, 0.3])
    cache_curve("qwen2.5-0.5b", "drafter", backend, [0.03, 0.05, 0.08])
    alone = BenchResult("target only", "none", 0, prompts=1, totals=Stats(tokens=40, target_passes=40, total_seconds=2.0))
    chain = BenchResult("chain @4", "chain", 4, prompts=1, totals=Stats(tokens=40, target_passes=12, total_seconds=2.5))
    record_bench(machine_facts().fingerprint(), "qwen2.5-coder-1.5b", backend, [alone, chain])
    f = forecast(load_pair("qwen2.5-coder-1.5b"), LoadOptions(target_backend="llama"))
    assert f.measured_tps("target only") == pytest.approx(20.0)
    config, tps = f.measured_speculative()
    assert tps == pytest.approx(16.0) and (config == plan_config(f.speculative) or config == "chain @4")


def ondevice(home, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "ONDEVICE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, env=env, timeout=300)


def test_models_predict_lists_every_pair_as_json(home):
    result = ondevice(home, "models", "--predict", "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert [r["pair"] for r in records] == [p.name for p in list_pairs()]
    assert all(r["to_measure"].startswith("ondevice bench --synthetic ") for r in records)


def test_profile_of_a_pair_not_downloaded_predicts_and_downloads_nothing(home):
    result = ondevice(home, "profile", "-m", "qwen3-32b", "--json", "--target-backend", "torch", "--ram-memory", "8GiB")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)[0]
    assert record["pair"] == "qwen3-32b" and record["backend"].startswith("torch-")
    assert record["to_measure"] == "ondevice bench --synthetic qwen3-32b --target-backend torch --ram-memory 8GiB"
    assert not (home / "models").exists()


# --- a forecast from curves just measured (`ondevice bench --synthetic PAIR`) -------------------------


def streamed(shape: str, role: str, seconds, max_tree: int) -> SyntheticMeasurement:
    ns = tuple(1 << i for i in range(len(seconds)))
    plan = {"placement": "disk", "max_tree": max_tree, "kept_layers": 9, "head_kept": True, "predicted_bytes_read_per_pass": 1}
    return SyntheticMeasurement(shape, role, "llama-cpu-t2", "cgroup 3.5 GB", "target streams from disk", LatencyCurve(ns, tuple(seconds)),
                                Traffic(1, "disk", "disk read", 1.0), 1, 0, memory=plan)  # fmt: skip


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply")  # Sequoia's table: p = 0 times its -inf slot for 0 nodes (overwritten)
def test_forecast_from_measured_curves_borrows_the_default_pairs_acceptance_and_keeps_trees_in_the_plan(home, monkeypatch):
    """A flat 2 s streamed pass, a drafter that costs nothing, and the default pair's measured
    acceptance p = [0.5, 0, 0, ...] (only the drafter's first choice is ever right): the best tree
    is a chain as deep as the plan allows (4 nodes), emitting 1 + 0.5 + 0.25 + 0.125 + 0.0625 tokens
    per 2 s pass, by hand."""
    from ondevice.cli.synthetic_bench import forecast_lines, pair_forecast
    from ondevice.synthetic import forecast as forecast_module

    p_half = np.array([0.5] + [0.0] * 7)
    own = {"qwen2.5-coder-1.5b": (p_half, "measured")}
    monkeypatch.setattr(forecast_module, "acceptance_for", lambda pair, family: own.get(pair, (np.array([0.6, 0.1] + [0.0] * 6), "prior")))
    target = streamed("qwen2.5-7b", "target", [2.0] * 7, max_tree=4)
    drafter = streamed("qwen2.5-0.5b", "drafter", [1e-9] * 8, max_tree=4)
    f = forecast_measured(load_pair("qwen2.5-7b"), target, drafter)
    assert f.acceptance == "measured on qwen2.5-coder-1.5b" and f.top1 == 0.5
    assert f.alone == pytest.approx(0.5)
    assert f.speculative.budget <= 4  # the memory plan's largest tree
    assert f.speculative.predicted_tokens_per_pass == pytest.approx(1.9375, rel=1e-6)
    assert f.speculative.predicted_tokens_per_second == pytest.approx(1.9375 / 2.0, rel=1e-3)
    lines = forecast_lines(pair_forecast("qwen2.5-7b", {"target": target, "drafter": drafter}))  # as `bench --synthetic` prints it
    assert "a forecast, not a measurement" in lines[0] and "measured on qwen2.5-coder-1.5b" in lines[0] and "cgroup 3.5 GB" in lines[0]
    assert lines[1] == "  target alone: 0.50 tok/s" and "0.97 tok/s (1.94 tokens per pass" in lines[2]
    assert pair_forecast("qwen2.5-7b", {"target": target}) is None and pair_forecast("qwen3-8b-ish", {}) is None
    own.clear()  # the default pair has not run here either: the family's prior, named so
    assert forecast_measured(load_pair("qwen2.5-7b"), target, drafter).acceptance == "prior"
