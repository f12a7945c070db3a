"""A slower disk for one command: the kernel's block-I/O throttle, in a cgroup of its own.

The regime ondevice is built for is the one where reading the target's weights bounds a pass: a
32–70B model on a laptop reads tens of GB a pass from an NVMe disk. The development VM's disk reads
the default pair's 0.8 GB a pass in 0.2–0.6 s, its speed drifting by half within minutes, so whether a
round is the disk's or the CPU's changes with the hour. A read cap makes it the disk's, the same in
every run: cgroup v1's `blkio.throttle.read_bps_device`, or v2's `io.max` (`rbps=`), on the whole
disk that holds the model files. It caps every read of the command's processes, direct or through
the page cache (the kernel's readahead included), and nobody else's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ondevice.errors import OndeviceError
from ondevice.machine import ram


def whole_disk(path: Path) -> str:
    """"MAJOR:MINOR" of the whole disk holding `path` (a partition's disk: the throttle takes disks)."""
    st = os.stat(path)
    device = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not device.exists():
        raise OndeviceError(f"{path} is not on a block device (tmpfs or an overlay without one): no disk to slow down.")
    device = device.resolve()
    if (device / "partition").exists():
        device = device.parent
    return (device / "dev").read_text().strip()


class ReadThrottle:
    """A cgroup whose processes read from `disk` ("MAJOR:MINOR") at most `bps` bytes a second."""

    def __init__(self, disk: str, bps: int, name: str | None = None):
        found = ram.own_cgroup_folder("blkio")
        if found is None:
            raise OndeviceError("no blkio (v1) or io (v2) cgroup hierarchy is mounted here: the disk cannot be slowed down.")
        parent, self.version = found
        self.disk, self.bps = disk, bps
        self.folder = parent / (name or f"ondevice-slowdisk-{os.getpid()}")
        try:
            if self.version == 2:
                (parent / "cgroup.subtree_control").write_text("+io")
            self.folder.mkdir()
            if self.version == 1:
                (self.folder / "blkio.throttle.read_bps_device").write_text(f"{disk} {bps}")
            else:
                (self.folder / "io.max").write_text(f"{disk} rbps={bps}")
        except OSError as err:
            self.remove()
            raise OndeviceError(f"cannot cap reads from disk {disk} below {parent} ({err.strerror}; needs root or a delegated cgroup).") from err

    def held(self) -> int | None:
        """The cap the kernel holds for the disk now (None: none)."""
        name = "blkio.throttle.read_bps_device" if self.version == 1 else "io.max"
        for line in (self.folder / name).read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == self.disk:
                value = fields[1] if self.version == 1 else dict(f.split("=", 1) for f in fields[1:]).get("rbps", "max")
                return None if value == "max" else int(value)
        return None

    def join(self) -> None:
        """Move the calling process into the cgroup (run in the child before exec)."""
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        remove_cgroup(self.folder)


def remove_cgroup(folder: Path) -> None:
    """Remove a cgroup's folder once its processes have left (the last may take a moment); gone already: nothing."""
    for _ in range(50):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
