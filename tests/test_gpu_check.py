"""The GPU check (`python -m ondevice.eval.gpu_check`) as far as a CPU takes it: its CPU path at
small shapes writes the JSON a GPU run writes, with measured numbers that are positive and
consistent with each other; steps that do not fit its time budget are skipped and say so; the
CUDA-tests step reports what pytest ran, failed and could not import.

The references are independent of the check's own arithmetic: each model's layer sizes from the
quant mix, the target-alone speed as the inverse of the measured 1-token pass, pytest's own
outcomes of a folder of known tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ondevice.eval.gpu_steps import TINY_DRAFT_SIZES, TINY_TARGET_SIZES, check_shapes
from ondevice.eval.gpu_tests import run_cuda_tests
from ondevice.offload.layout import ALIGN
from ondevice.synthetic.quant_mix import preset_tensors

NOISE = 1.5  # a shared 2-core CPU: a pass may measure this much slower than a larger one (plus 5 ms)


def run_check(tmp_path, *args: str) -> dict:
    out = tmp_path / "gpu.json"
    env = {**os.environ, "ONDEVICE_HOME": str(tmp_path / "home")}  # acceptance: the shipped prior, not this machine's
    done = subprocess.run([sys.executable, "-m", "ondevice.eval.gpu_check", "--tiny", "--device", "cpu", "--out", str(out), *args],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def layer_bytes(shape) -> list[int]:
    tensors = preset_tensors(shape)
    return [sum(t.nbytes for t in tensors if t.name.startswith(f"blk.{i}.")) for i in range(shape.n_layers)]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    # a budget no step can run out of, even paused for minutes by others' work on a shared machine
    return run_check(tmp_path_factory.mktemp("check"), "--budget-s", "36000")


def test_the_report_says_what_ran_and_what_was_skipped(report):
    assert report["machine"]["cuda"] is False and report["machine"]["gguf"] and 0 < report["seconds"] <= report["budget_s"]
    steps = report["steps"]
    assert steps["cuda_tests"] == {"status": "skipped", "why": "no CUDA GPU here"}
    assert steps["pinned_bandwidth"]["status"] == "skipped"
    assert [name for name, step in steps.items() if step["status"] == "ok"] == [
        "drafter:qwen2.5-0.5b", "drafter:llama-3.2-1b", "target:qwen2.5-32b", "target:llama-3.3-70b"]  # fmt: skip
    assert report["anchor"]["system"] == "UMbreLLa" and report["anchor"]["tokens_per_second"] == 8.6


@pytest.mark.parametrize("name", ["qwen2.5-32b", "llama-3.3-70b"])
def test_a_streamed_target_measured_positive_and_consistent_numbers(report, name):
    step, shape = report["steps"][f"target:{name}"], check_shapes(True)[name]
    assert step["ns"] == list(TINY_TARGET_SIZES) and step["not_timed"] == []
    seconds = step["seconds"]
    assert all(t > 0 for t in seconds)
    assert all(seconds[i] <= NOISE * seconds[j] + 0.005 for i in range(len(seconds)) for j in range(i + 1, len(seconds)))
    sizes = layer_bytes(shape)  # the streamed layers' bytes, as the quant mix sizes them
    n = step["layers_streamed"]
    assert 0 < n < shape.n_layers and step["layers_on_device"] == shape.n_layers - n
    assert n * min(sizes) <= step["bytes_per_pass"] <= n * (max(sizes) + ALIGN * 16)
    assert step["copy_gbps"] > 0 and step["achieved_gbps"] == pytest.approx(step["bytes_per_pass"] / step["curve_seconds"][0] / 1e9)


def test_drafters_are_resident_and_timed_to_their_largest_batch(report):
    for name in ("qwen2.5-0.5b", "llama-3.2-1b"):
        step = report["steps"][f"drafter:{name}"]
        assert step["ns"] == list(TINY_DRAFT_SIZES) and step["layers_streamed"] == 0 and all(t > 0 for t in step["seconds"])


def test_the_prediction_is_stated_as_one_and_consistent_with_the_curves(report):
    for prediction in report["predictions"]:
        target = report["steps"][f"target:{prediction['target']}"]
        assert prediction["target_alone_tokens_per_second"] == pytest.approx(1 / target["curve_seconds"][0])
        assert prediction["predicted_tokens_per_pass"] >= 1 and prediction["predicted_tokens_per_second"] > 0
        assert prediction["acceptance"].startswith("prior:") and prediction["top1_acceptance"] == 0.86
        assert prediction["statement"].startswith("A prediction, not a measurement")


def test_what_does_not_fit_the_budget_is_skipped_and_said(tmp_path):
    report = run_check(tmp_path, "--budget-s", "20")
    for name, step in report["steps"].items():
        if name.startswith(("target:", "drafter:")):
            assert step["status"] == "skipped" and step["why"].startswith("not enough of the"), (name, step)
    assert all(p["why"].startswith("not predicted:") for p in report["predictions"])


def test_the_cuda_tests_step_counts_what_pytest_ran(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  cuda: needs a GPU\n")
    (tests / "test_needs_llama.py").write_text("import llama_cpp_not_here\n\ndef test_x():\n    pass\n")
    (tests / "test_gpu.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.cuda\ndef test_passes():\n    pass\n\n"
        "@pytest.mark.cuda\ndef test_fails():\n    assert 1 == 2, 'wrong'\n\n"
        "@pytest.mark.cuda\n@pytest.mark.skip(reason='no')\ndef test_skipped():\n    pass\n\n"
        "def test_not_cuda():\n    pass\n"
    )
    result = run_cuda_tests(tmp_path, 120, tests)
    assert (result["status"], result["passed"], result["failed"], result["skipped"], result["errors"]) == ("failed", 1, 1, 1, 0)
    assert result["failures"] == ["tests.test_gpu::test_fails: AssertionError: wrong"]
    assert result["modules_not_imported"] == ["tests.test_needs_llama: ModuleNotFoundError: No module named 'llama_cpp_not_here'"]
