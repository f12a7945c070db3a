"""How busy the disk holding a file is: the block device's own counters (Linux sysfs).

/sys/dev/block/MAJOR:MINOR/stat (Documentation/block/stat.rst) counts, since boot, the sectors read
and `io_ticks`, the milliseconds during which the device had at least one request in flight. Over
a stretch of decoding, io_ticks / wall time is the disk's utilization: 1.0 when a read was always
in flight. These are the device's counters, so they include every process's I/O to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SECTOR = 512  # the stat file counts 512-byte sectors whatever the device's own block size


@dataclass(frozen=True)
class DiskCounters:
    busy_seconds: float  # io_ticks
    read_bytes: int


def stat_file(path: str | Path) -> Path | None:
    """The sysfs stat file of the block device (or partition) holding `path` (None: not a block
    device, e.g. tmpfs or an overlay without one, or not Linux)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stat = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    return stat if stat.is_file() else None


def read_counters(stat: Path | None) -> DiskCounters | None:
    if stat is None:
        return None
    try:
        fields = stat.read_text().split()
        return DiskCounters(busy_seconds=int(fields[9]) / 1000, read_bytes=int(fields[2]) * SECTOR)
    except (OSError, ValueError, IndexError):
        return None
