"""The GPU pipeline measurement (`python -m ondevice.eval.gpu_pipeline`) as far as a CPU takes it: at
small shapes the synthetic target (streamed within a quarter budget), a synthetic GGUF drafter in
llama.cpp and the engine run every configuration with overlap off and on; every greedy answer is
the target alone's (the engine's exactness, whatever the tree and the overlap: tiny random models
have no near-ties at these margins); a round's parts add up (both at once never take longer than
one after the other, within a busy CPU's noise); and Accelerate's offload baseline times its passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ondevice.eval.gpu_pipeline import TINY_CONFIGS


def run_step(tmp_path, *args: str) -> dict:
    out = tmp_path / "step.json"
    env = {**os.environ, "ONDEVICE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "ondevice.eval.gpu_pipeline", *args, "--tiny", "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_pipeline_runs_every_config_exactly(tmp_path):
    record = run_step(tmp_path, "pipeline", "--gpu-memory", "quarter", "--threads", "1", "--max-tokens", "6")
    assert record["status"] == "ok"
    assert record["layers_streamed"] > 0  # the target really streams
    runs = record["runs"]
    assert [(r["config"], r["overlap"]) for r in runs] == [("target", False)] + [
        (f"{b}@{n}", o) for b, n in TINY_CONFIGS[1:] for o in (False, True)
    ]
    alone = runs[0]["token_ids"]
    assert len(alone) == 6
    for r in runs:
        assert r["token_ids"] == alone, r["config"]
        assert r["rounds"] >= 1 and r["round_seconds"] > 0
        assert r["pass_seconds_mean"] <= r["round_seconds"] * 1.01  # each pass within its round (a median may not be)
    assert record["answers_equal_target_alone"] == len(runs) - 1
    for part in record["parts"]:
        assert part["nodes"] > 1
        assert part["both_wall"] <= 1.5 * (part["draft_alone"] + part["pass_alone"]) + 0.05
    rows = record["forecast"]["rows"]
    assert [r["config"] for r in rows] == [p["config"] for p in record["parts"]]
    assert all(r["tokens_per_pass"] >= 1 for r in rows)


def test_accelerate_baseline_times_passes(tmp_path):
    pytest.importorskip("accelerate")
    record = run_step(tmp_path, "accelerate")
    assert record["status"] == "ok"
    assert record["layers_on_device"] + record["layers_offloaded"] > 0
    assert set(record["passes"]) == {"1", "4"} and len(record["passes"]["1"]) == 2
    assert all(s > 0 for times in record["passes"].values() for s in times)
