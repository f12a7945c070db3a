"""What each measured target pass cost besides its time: bytes read from storage, per pass size.

    meter = PassMeter(target, pass_counters(path))   # stands in for the target while its curve is timed
    measure_target_timing(meter, ns)
    meter.summary()   # {"ns": [1, 4], "seconds": [...], "read_bytes": [...]}: the median pass of each size

A streamed target's pass time is bound by what it reads from disk, so the measurement records what
each pass read (/proc/self/io: the page faults and the page cache's read-ahead of this process)
beside what the memory plan predicted. Only `forward_tree` — the pass itself — is metered: the
measuring context's prefill and the cache bookkeeping are not passes.

Every counter (`pass_counters`) is read before and after each pass and its difference kept. A counter of
the disk's busy time (seconds the device had I/O in flight, /sys/block/<dev>/stat io_ticks) goes in
as "disk_busy_seconds"; the summary then also gives the disk's utilization, busy / pass seconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from ondevice.machine.disk_io import read_counters, stat_file
from ondevice.machine.ram import disk_read_bytes

Counter = Callable[[], float | None]  # a monotonic reading; None where this machine does not say


def pass_counters(path: Path) -> dict[str, Counter]:
    """name → reading, for the passes of the model file at `path`; the busy time of the disk holding
    it (machine/disk_io.py: every process's I/O to that device) where sysfs says."""
    counters: dict[str, Counter] = {"seconds": time.perf_counter, "read_bytes": disk_read_bytes}
    stat = stat_file(path)
    if stat is not None:
        counters["disk_busy_seconds"] = lambda: getattr(read_counters(stat), "busy_seconds", None)
    return counters


class PassMeter:
    """The target, with each `forward_tree` metered; everything else passes through to it."""

    def __init__(self, target, counters: dict[str, Counter]):
        self.target = target
        self.counters = dict(counters)
        self.passes: dict[int, list[dict[str, float | None]]] = {}  # pass size → one record per pass

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward_tree(self, tree, *args, **kwargs):
        before = {name: read() for name, read in self.counters.items()}
        out = self.target.forward_tree(tree, *args, **kwargs)
        after = {name: read() for name, read in self.counters.items()}
        self.passes.setdefault(len(tree), []).append(
            {name: None if before[name] is None or after[name] is None else after[name] - before[name] for name in self.counters}
        )
        return out

    def summary(self) -> dict[str, list]:
        """Per pass size (ascending), the median of each counter over its passes (None: not known),
        and the disk's utilization where its busy time is counted."""
        ns = sorted(self.passes)
        out: dict[str, list] = {"ns": ns}
        for name in self.counters:
            out[name] = [_median([p[name] for p in self.passes[n]]) for n in ns]
        if "disk_busy_seconds" in out and "seconds" in out:
            out["disk_utilization"] = [None if b is None or not s else b / s for b, s in zip(out["disk_busy_seconds"], out["seconds"])]
        return out


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
