"""The memory sweep's picture and the rows it reads: points placed where their limits and speeds are,
the disk bound computed from a point's own tokens and bytes per pass, failed runs left out, the
commands each series runs."""

from __future__ import annotations

import sys
import time
import xml.etree.ElementTree as ET

import pytest

from ondevice.eval import memory_sweep, sweep_plot

RECORD = {"date": "2026-11-28", "prompts": "heldout16-code", "max_tokens": 48, "disk_gbps": 1.5, "target": "T", "target_bytes": 1.1e9,
          "points": [
              {"series": "llama-cpp", "limit_gb": 0.9, "tokens_per_second": 1.25, "tokens_per_pass": 1.0},
              {"series": "target", "limit_gb": 0.9, "tokens_per_second": 3.0, "tokens_per_pass": 1.0, "bytes_read_per_pass": 4.0e8},
              {"series": "default", "limit_gb": 0.9, "tokens_per_second": 5.0, "tokens_per_pass": 4.0, "bytes_read_per_pass": 8.0e8},
              {"series": "default", "limit_gb": 1.2, "error": "killed"},
              {"series": "target", "limit_gb": 1.6, "tokens_per_second": 19.0, "tokens_per_pass": 1.0, "target_in_ram": True},
              {"series": "default", "limit_gb": None, "tokens_per_second": 21.0, "tokens_per_pass": 1.2, "target_in_ram": True},
          ]}  # fmt: skip


def test_the_bound_is_tokens_per_pass_times_bandwidth_over_bytes_per_pass():
    lines = sweep_plot.series_points(RECORD)
    assert lines["bound"] == [(0.9, 4.0 * 1.5e9 / 8.0e8)]  # 7.5 tok/s: only the streamed default point has one
    assert lines["default"] == [(0.9, 5.0), (1.6 + (1.6 - 1.2), 21.0)]  # the failed run left out; "RAM" one step (the last) past the largest limit
    assert sweep_plot.bound(RECORD["points"][4], 1.5) is None  # in RAM nothing streams


def test_the_svg_draws_each_series_and_shades_where_the_target_fits(tmp_path):
    path = tmp_path / "sweep.svg"
    sweep_plot.write_svg(RECORD, path)
    root = ET.parse(path).getroot()  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    paths = root.findall(f"{ns}path")
    assert len(paths) == 4  # llama-cpp, target, default, bound
    assert any(p.get("stroke-dasharray") for p in paths)  # the bound is dashed
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert "the target fits in RAM" in texts and "RAM" in texts and "0.9" in texts


def test_each_series_runs_its_own_command(tmp_path):
    out = tmp_path / "x.json"
    assert memory_sweep.commands("llama-cpp", "p", 2, 48, out)[:3] == [sys.executable, "-m", "ondevice.eval.llamacpp_rows"]
    target = memory_sweep.commands("target", "p", 2, 48, out)
    assert "--no-draft" in target and target[1:4] == ["-m", "ondevice", "bench"]
    assert "--no-draft" not in memory_sweep.commands("default", "p", 2, 48, out)


def test_rows_are_read_from_the_bench_report():
    bench = {"results": [{"config": "target only", "tokens_per_second": 3.0, "tokens_per_pass": 1.0, "bytes_read_per_pass": 4e8},
                         {"config": "auto: best-first@8 ×5 (rounds)", "tokens_per_second": 6.0, "tokens_per_pass": 4.0, "bytes_read_per_pass": 7e8}],
             "placement": {"placement": "disk", "summary": "target streams"}}  # fmt: skip
    assert memory_sweep.row_of("target", bench)["tokens_per_second"] == 3.0
    default = memory_sweep.row_of("default", bench)
    assert default["tokens_per_pass"] == 4.0 and default["target_in_ram"] is False
    assert memory_sweep.row_of("llama-cpp", {"rows": [{"tokens_per_second": 1.2}]})["tokens_per_pass"] == 1.0


def test_no_disk_bound_where_the_answer_hardly_streams():
    """Where the file nearly fits a pass reads a few MB: tokens per pass × bandwidth ÷ bytes would put
    the bound at hundreds of tok/s, and the plot's scale with it. Below a tenth of the file, none."""
    nearly_fits = {"series": "default", "limit_gb": 1.2, "tokens_per_second": 12.0, "tokens_per_pass": 1.07, "bytes_read_per_pass": 3.1e6}
    streams = {**nearly_fits, "bytes_read_per_pass": 8.0e8}
    assert sweep_plot.bound(nearly_fits, 2.2, target_bytes=1.1e9) is None
    assert sweep_plot.bound(streams, 2.2, target_bytes=1.1e9) == pytest.approx(1.07 * 2.2e9 / 8.0e8)
    lines = sweep_plot.series_points({**RECORD, "points": [*RECORD["points"], nearly_fits]})
    assert [x for x, _ in lines["bound"]] == [0.9]


def test_a_plan_keeping_every_layer_counts_as_the_target_in_ram():
    bench = {"results": [{"config": "target only", "tokens_per_second": 13.0, "tokens_per_pass": 1.0, "bytes_read_per_pass": 0.0}],
             "placement": {"placement": "disk", "predicted_bytes_read_per_pass": 0, "summary": "28 of 28 layers kept"}}  # fmt: skip
    assert memory_sweep.row_of("target", bench)["target_in_ram"] is True


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")  # killed, not reaped yet
    except FileNotFoundError:
        return True


def test_a_point_past_its_time_cap_is_stopped_with_everything_it_started(tmp_path):
    """A starved limit must not hold the sweep: the point's command and its children are killed."""
    pid_file = tmp_path / "child.pid"
    script = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    start = time.monotonic()
    assert memory_sweep.run_capped([sys.executable, "-c", script], timeout=2.0) == (None, "")
    assert time.monotonic() - start < 20
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)
    assert memory_sweep.run_capped([sys.executable, "-c", "import sys; sys.stderr.write('x')"], timeout=30) == (0, "x")
