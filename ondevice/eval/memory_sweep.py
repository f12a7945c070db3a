"""Speed against the memory limit: llama-cpp-python alone, ondevice's target alone and ondevice's default,
each in its own memory cgroup at every limit, plotted with the disk's physical bound.

    python -m ondevice.eval.memory_sweep --limits 0.8,0.9,1.0,1.2,1.4,1.6 --prompts heldout16-code \\
        --limit 2 --max-tokens 48 --out docs/measurements/memory-sweep

At each limit (GB, each run a process of its own in a cgroup of that size: eval/lowmem.py) and then
with no limit ("RAM"):

- llama-cpp-python: `python -m ondevice.eval.llamacpp_rows --rows llama-cpp` (the target alone, as a
  llama.cpp user runs it: memory-mapped);
- ondevice, target alone: `ondevice bench --no-draft --trees auto`, its "target only" row (the memory
  plan without the drafter: as many layers kept as fit);
- ondevice, default: `ondevice bench --trees auto`, its "auto" row (the drafter kept or left out as the
  load decides, the planner's trees).

The physical bound of a streamed answer is tokens per pass × disk bandwidth ÷ bytes read per pass
(the disk moving the target's bytes without a pause): drawn for the default's measured tokens and
bytes per pass, with the bandwidth of a sequential read of the target file measured first. Writes
`sweep.json` (every row, the commands, the bandwidth) and `sweep.svg` (eval/sweep_plot.py) to --out;
a run that fails, is OOM-killed or runs past --point-timeout is recorded as such and left out of the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ondevice.catalog.hub import local_path
from ondevice.catalog.pairs import load_pair
from ondevice.eval.sweep_plot import write_svg
from ondevice.machine.facts import measure_disk_read

LIMITS_GB = (0.8, 0.9, 1.0, 1.2, 1.4, 1.6)
SERIES = ("llama-cpp", "target", "default")


def commands(series: str, prompts: str, limit: int, max_tokens: int, out: Path) -> list[str]:
    """The command one point of a series runs (its JSON goes to `out`)."""
    common = ["--prompts", prompts, "--limit", str(limit), "--max-tokens", str(max_tokens)]
    if series == "llama-cpp":
        return [sys.executable, "-m", "ondevice.eval.llamacpp_rows", *common, "--rows", "llama-cpp", "--out", str(out)]
    draft = ["--no-draft"] if series == "target" else []
    return [sys.executable, "-m", "ondevice", "bench", "--trees", "auto", *draft, *common, "--json", "--out", str(out)]


def run_point(series: str, limit_gb: float | None, args, folder: Path) -> dict:
    """One series at one limit (None: no limit): its row, placement and the cgroup's report."""
    tag = f"{series}-{'ram' if limit_gb is None else f'{limit_gb:.2f}gb'}"
    out, report = folder / f"{tag}.json", folder / f"{tag}.lowmem.json"
    command = commands(series, args.prompts, args.limit, args.max_tokens, out)
    if limit_gb is not None:
        command = [sys.executable, "-m", "ondevice.eval.lowmem", "--cgroup", f"{limit_gb}GB", "--report", str(report), "--", *command]
    start = time.monotonic()
    returncode, stderr = run_capped(command, args.point_timeout)
    point = {"series": series, "limit_gb": limit_gb, "command": " ".join(command[1:]), "seconds": time.monotonic() - start,
             "returncode": returncode}  # fmt: skip
    if returncode is None:
        return {**point, "error": f"stopped after {args.point_timeout:.0f} s (--point-timeout)"}
    if returncode != 0 or not out.exists():
        return {**point, "error": (stderr.strip().splitlines() or ["no output"])[-1]}
    if report.exists():
        point["cgroup"] = {k: v for k, v in json.loads(report.read_text()).items() if k in ("peak_usage_bytes", "oom_kills", "major_faults")}
    return {**point, **row_of(series, json.loads(out.read_text()))}


def run_capped(command: list[str], timeout: float | None) -> tuple[int | None, str]:
    """Run a point's command in a process group of its own; after `timeout` seconds the whole group
    (the cgroup runner and what it started) is killed and the return code is None."""
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            _, stderr = proc.communicate(timeout=timeout)
            return proc.returncode, stderr
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, ""


def row_of(series: str, record: dict) -> dict:
    """What the plot needs from a series' JSON: tok/s, tokens and bytes per pass, where the target lived."""
    if series == "llama-cpp":
        row = record["rows"][0]
        return {"tokens_per_second": row["tokens_per_second"], "tokens_per_pass": 1.0, "bytes_read_per_pass": row.get("bytes_read_per_pass")}
    wanted = "target only" if series == "target" else "auto"
    row = next(r for r in record["results"] if r["config"].startswith(wanted))
    placement = record.get("placement") or {}
    return {"tokens_per_second": row["tokens_per_second"], "tokens_per_pass": row["tokens_per_pass"],
            "bytes_read_per_pass": row.get("bytes_read_per_pass"), "config": row["config"],
            "target_in_ram": placement.get("placement") == "ram" or placement.get("predicted_bytes_read_per_pass") == 0,
            "placement": placement.get("summary")}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ondevice.eval.memory_sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default=",".join(str(x) for x in LIMITS_GB), help="memory limits in GB, comma-separated")
    parser.add_argument("--prompts", default="heldout16-code")
    parser.add_argument("--limit", type=int, default=2, help="the first N prompts")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--series", default=",".join(SERIES))
    parser.add_argument("--no-ram", action="store_true", help="leave out the point with no limit")
    parser.add_argument("--point-timeout", type=float, default=None, metavar="SECONDS",
                        help="stop a point that runs longer (a starved limit) and record it as stopped")
    parser.add_argument("--out", type=Path, default=Path("memory-sweep"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    pair = load_pair(None)
    target = local_path(pair.target)
    bandwidth = max(measure_disk_read(target) for _ in range(3))
    limits = [float(x) for x in args.limits.split(",")] + ([] if args.no_ram else [None])
    record = {"date": time.strftime("%Y-%m-%d"), "prompts": args.prompts, "limit": args.limit, "max_tokens": args.max_tokens,
              "disk_gbps": bandwidth, "target": pair.target.label, "target_bytes": os.path.getsize(target), "command": " ".join(["python -m ondevice.eval.memory_sweep", *(argv or sys.argv[1:])]),
              "points": []}  # fmt: skip
    for limit_gb in limits:
        for series in args.series.split(","):
            point = run_point(series, limit_gb, args, args.out)
            record["points"].append(point)
            print(json.dumps({k: point.get(k) for k in ("series", "limit_gb", "tokens_per_second", "tokens_per_pass", "error")}), flush=True)
            (args.out / "sweep.json").write_text(json.dumps(record, indent=1))
    write_svg(record, args.out / "sweep.svg")


if __name__ == "__main__":
    main()
