"""A synthetic measurement taken while other processes use the CPU is detected and not cached.

`ondevice bench --synthetic` keeps its curves per machine for `ondevice models --predict`; one taken
beside another job (llama.cpp's spinning threads make an oversubscribed CPU 5-10x slower) would
stand for that shape until measured again. The disturbance here is real: processes spinning on
every core for the whole measurement, started by the test (as tests/test_timing.py does). The quiet
case cannot be had on a machine others share, so there the meter is told the machine is quiet.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console

from ondevice.loading.options import LoadOptions
from ondevice.plan import timing
from ondevice.machine.facts import machine_facts
from ondevice.synthetic.cache import load_measurement
from ondevice.synthetic.measure import busy_line, measure
from ondevice.synthetic.shapes import ModelShape
from ondevice.synthetic.sources import from_preset

TINY = ModelShape("busy-tiny", "qwen2", 2, 256, 320, 4, 2, 64, 512)
# 74 MB: a pass of 16-64 tokens takes 50-300 ms here, long enough for the meter's 10 ms ticks to
# judge every sample (a sample of a few ms shows no other process whatever the load)
MID = ModelShape("busy-mid", "qwen2", 8, 1024, 4096, 8, 2, 128, 512)
SIZES = [16, 32]


def spinners(count: int) -> list[subprocess.Popen]:
    """`count` processes spinning until stopped (at most 5 minutes)."""
    code = "import time\nend = time.time() + 300\nwhile time.time() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


class QuietMeter(timing.CpuMeter):
    """Reports that no other process ran: this process's own CPU time is all the machine's."""

    def read(self) -> tuple[float, float, float]:
        wall, _, own = super().read()
        return wall, own, own


def test_a_measurement_on_a_busy_machine_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    procs = spinners(max(3, 2 * (os.cpu_count() or 1)))
    try:
        m = measure(from_preset(MID), LoadOptions(target_backend="llama", ctx=256), ns=SIZES, show=False)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert m.busy_cores is not None and m.busy_cores > 0.5, m.busy_cores  # every core was taken
    assert load_measurement(machine_facts().fingerprint(), MID.name, "target", m.backend) is None
    assert not (tmp_path / "synthetic" / "curves").exists() or not any((tmp_path / "synthetic" / "curves").iterdir())
    line = busy_line(m)
    assert line == f"the machine was busy (others used ~{m.busy_cores:.1f} cores): not cached; run again when it is quiet"


def test_a_measurement_on_a_quiet_machine_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setattr(timing, "CpuMeter", QuietMeter)
    m = measure(from_preset(TINY), LoadOptions(target_backend="llama", ctx=128), ns=(1, 2), show=False)
    assert m.busy_cores is None and busy_line(m) is None
    cached = load_measurement(machine_facts().fingerprint(), TINY.name, "target", m.backend)
    assert cached is not None and cached.curve == m.curve


def test_the_cli_says_it_did_not_cache(tmp_path, monkeypatch):
    """`ondevice bench --synthetic` prints the one line (and `cached: false` with --json)."""
    from ondevice.cli import synthetic_bench

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setattr(synthetic_bench, "resolve", lambda name: [from_preset(MID)])
    err = io.StringIO()
    monkeypatch.setattr(synthetic_bench, "err", Console(file=err, width=200))
    procs = spinners(max(3, 2 * (os.cpu_count() or 1)))
    try:
        synthetic_bench.run_synthetic(MID.name, SIZES, False, False, True, LoadOptions(target_backend="llama", ctx=256))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert "the machine was busy (others used ~" in err.getvalue() and "not cached; run again when it is quiet" in err.getvalue()
