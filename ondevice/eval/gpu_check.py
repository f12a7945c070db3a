"""The GPU harness in one command: `python -m ondevice.eval.gpu_check --out gpu.json` (or scripts/gpu_check.sh).

On a machine with a CUDA GPU, torch, numpy and the `gguf` package (pure Python; carry its wheel
where it is missing: scripts/gpu_check.sh), with no model hub and no llama.cpp, in at most
`--budget-s` seconds (default 8 minutes), each step in its own process with its own share of the
time (a step that does not fit is skipped and the JSON says why):

1. facts: GPU, CUDA, torch, what is installed;
2. the CUDA tests (`pytest -m cuda`; test modules that need llama.cpp fail to import there and are
   listed as such);
3. pinned host↔device bandwidth (the peak a streamed pass can reach);
4. the draft-call curves of synthetic Qwen2.5-0.5B and Llama-3.2-1B, resident on the GPU (torch:
   ondevice's llama.cpp CPU drafter cannot run there);
5. the synthetic Qwen2.5-32B and Llama-3.3-70B torch targets (random weights at the real shapes in
   llama.cpp's Q4_K_M blocks, built in memory: `synthetic.offloaded`), streamed from pinned RAM
   under `--gpu-memory` (default 24GB, an RTX 4090's): pass time vs tokens 1…2048, bytes moved per
   pass, the copy rate, and the achieved bandwidth against the pinned peak;
6. predicted tok/s of each pair — a prediction, not a measurement: the planner's cost model on the
   measured curves with the default pair's measured acceptance — next to UMbreLLa's published
   figure (docs/measurements/2026-11-27-gpu-h100.md).

`--tiny --device cpu` runs the same steps on a CPU at small shapes (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ondevice.eval.gpu_predict import ANCHOR, PAIRS, predictions
from ondevice.eval.gpu_tests import run_cuda_tests

BUDGET_S = 480  # the whole check, all steps together
MARGIN_S = 10  # kept back for starting processes and writing the JSON


@dataclass(frozen=True)
class Step:
    name: str  # the key in the JSON's "steps"
    allot_s: float  # its share of the budget (what earlier steps leave unused carries over)
    min_s: float  # below this much time it is skipped
    argv: tuple[str, ...] = ()  # gpu_steps arguments; () for the CUDA tests
    needs_cuda: bool = False
    needs_gguf: bool = False


def plan_steps(gpu_memory: str, device: str, scale: float = 1.0) -> list[Step]:
    """The steps in order, with their time shares (seconds out of 480, times `scale` for another budget)."""
    steps = [Step("cuda_tests", 140 * scale, 30, needs_cuda=True), Step("pinned_bandwidth", 15 * scale, 5, ("bandwidth",), needs_cuda=True)]
    for _, _, drafter in PAIRS:
        argv = ("model", "--shape", drafter, "--role", "drafter", "--device", device)
        steps.append(Step(f"drafter:{drafter}", 30 * scale, 10, argv, needs_gguf=True))
    for (_, target, _), allot in zip(PAIRS, (100, 150)):
        argv = ("model", "--shape", target, "--role", "target", "--device", device, "--gpu-memory", gpu_memory)
        steps.append(Step(f"target:{target}", allot * scale, 40, argv, needs_gguf=True))
    return steps


def run_check(out: Path, gpu_memory: str, device: str, budget_s: float, tiny: bool, skip_tests: bool) -> dict:
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    report = {"format": 1, "command": " ".join(["python -m ondevice.eval.gpu_check", *sys.argv[1:]]),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "budget_s": budget_s, "gpu_memory": gpu_memory,
              "device": device, "tiny": tiny, "steps": {}}  # fmt: skip
    facts = run_step(("facts",), work / "facts.json", max(60.0, budget_s / 8), tiny)  # importing torch can take a while
    report["machine"] = facts
    steps = plan_steps(gpu_memory, device, budget_s / BUDGET_S)
    carry = 0.0
    for k, step in enumerate(steps):
        left = budget_s - MARGIN_S - (time.monotonic() - start) - sum(s.min_s for s in steps[k + 1 :])
        seconds = min(step.allot_s + carry, left)
        why = skip_reason(step, facts, seconds, skip_tests)
        if why:
            report["steps"][step.name] = {"status": "skipped", "why": why}
            carry += step.allot_s  # unused; what bounds a later step is the time really left
            continue
        began = time.monotonic()
        if step.name == "cuda_tests":
            record = run_cuda_tests(work, seconds)
        else:
            record = run_step(step.argv + ("--seconds", f"{seconds - 5:.0f}"), work / f"step{k}.json", seconds, tiny)
        record["wall_seconds"] = time.monotonic() - began
        report["steps"][step.name] = record
        carry = max(0.0, step.allot_s + carry - record["wall_seconds"])
        _write(out, report)
    report["predictions"] = predictions(report["steps"], facts, gpu_memory)
    report["anchor"] = ANCHOR
    report["seconds"] = time.monotonic() - start
    _write(out, report)
    return report


def skip_reason(step: Step, facts: dict, seconds: float, skip_tests: bool) -> str | None:
    if step.needs_cuda and not facts.get("cuda"):
        return "no CUDA GPU here"
    if step.name == "cuda_tests" and skip_tests:
        return "--skip-tests"
    if seconds < step.min_s:
        return f"not enough of the budget left ({max(seconds, 0):.0f} s for a step that needs {step.min_s:.0f})"
    if step.needs_gguf and not facts.get("gguf"):
        return "the gguf package is missing (pure Python: carry its wheel, see scripts/gpu_check.sh)"
    return None


def run_step(argv: tuple[str, ...], out: Path, seconds: float, tiny: bool) -> dict:
    """One gpu_steps step in its own process; its JSON, with "status" "failed" / "timed out" when it did not finish."""
    command = [sys.executable, "-m", "ondevice.eval.gpu_steps", *argv, "--out", str(out)] + (["--tiny"] if tiny else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        partial = _read(out)
        return {**partial, "status": "timed out", "why": f"still running after {seconds:.0f} s (its share of the budget)"}
    record = _read(out)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {**record, "status": "failed", "why": " | ".join(tail) or f"exit status {done.returncode}"}
    return record


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu.json"), help="the JSON report (written after every step)")
    parser.add_argument("--gpu-memory", default=None, help="device budget of the 32B/70B targets (default 24GB: an RTX 4090's; "
                        "with --tiny: a quarter of the layers)")  # fmt: skip
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the CPU path (with --tiny)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds for the whole check")
    parser.add_argument("--tiny", action="store_true", help="small stand-ins of the models (the CPU path)")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the CUDA tests")
    args = parser.parse_args(argv)
    gpu_memory = args.gpu_memory or ("quarter" if args.tiny else "24GB")
    report = run_check(args.out, gpu_memory, args.device, args.budget_s, args.tiny, args.skip_tests)
    for line in summary_lines(report):
        print(line)


def summary_lines(report: dict) -> list[str]:
    lines = [f"{report['machine'].get('gpu') or 'no GPU'} · {report['seconds']:.0f} s of {report['budget_s']:.0f} · {report['command']}"]
    for name, step in report["steps"].items():
        lines.append(f"{name}: {step.get('status', 'ok')}" + (f" ({step['why']})" if step.get("why") else "") + _step_numbers(step))
    for p in report["predictions"]:
        if p.get("predicted_tokens_per_second"):
            lines.append(f"{p['pair']}: predicted {p['predicted_tokens_per_second']:.1f} tok/s ({p['config']}), target alone "
                         f"{p['target_alone_tokens_per_second']:.2f}; {ANCHOR['system']} {ANCHOR['tokens_per_second']} tok/s on {ANCHOR['hardware']}")  # fmt: skip
    return lines


def _step_numbers(step: dict) -> str:
    """The few numbers a reader looks for on a step's line: test counts, bandwidths, placement."""
    if "passed" in step:
        return (f", {step['passed']} passed, {step.get('failed', 0)} failed, {step.get('errors', 0)} errors, "
                f"{len(step.get('modules_not_imported', []))} test modules not imported")  # fmt: skip
    if "host_to_device_gbps" in step:
        return f", pinned host→device {step['host_to_device_gbps']:.1f} GB/s, device→host {step['device_to_host_gbps']:.1f} GB/s"
    if step.get("placement"):
        return f", {step['placement']}"
    return ""


if __name__ == "__main__":
    main(sys.argv[1:])
