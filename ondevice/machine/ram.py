"""How much RAM this process may use: the machine's available memory, or less inside a cgroup.

A container (docker --memory, systemd MemoryMax, Kubernetes limits) or our own low-RAM emulation
(`python -m ondevice.eval.lowmem`) puts the process in a memory cgroup whose limit counts the page
cache too: a model file read through mmap is charged to it, so a target larger than the limit has
to stream even when the machine has RAM to spare. psutil sees only the machine. So the budget is

    min(psutil available, cgroup limit − what the cgroup holds that cannot be reclaimed)

where "cannot be reclaimed" is the cgroup's usage minus its file cache (v1: memory.usage_in_bytes
minus total_{in,}active_file of memory.stat; v2: memory.current minus `file`), and the limit is the
smallest on the way up the hierarchy (v1: hierarchical_memory_limit; v2: every ancestor's memory.max).
"""

from __future__ import annotations

import ctypes
import gc
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from ondevice.sizes import format_bytes

UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a number near 2^63


@dataclass(frozen=True)
class CgroupMemory:
    path: Path  # the cgroup's folder
    version: int  # 1 or 2
    limit: int  # bytes
    usage: int  # bytes charged now, page cache included
    file_cache: int  # of which file pages (reclaimable)

    @property
    def available(self) -> int:
        return max(0, self.limit - (self.usage - self.file_cache))


@dataclass(frozen=True)
class RamBudget:
    bytes: int  # RAM this process may use in all (its own memory plus the page cache it reads through)
    source: str  # where the number comes from, for the placement line

    def describe(self) -> str:
        return f"{format_bytes(self.bytes)} ({self.source})"


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of each line of /proc/self/mountinfo."""
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3:
            out.append((fields[3], fields[4], tail[0], tail[2]))
    return out


def _folder(point: str, root: str, rel: str) -> Path:
    """The cgroup folder: the mount point plus the process's cgroup path below the mount's root."""
    if root != "/" and (rel == root or rel.startswith(root.rstrip("/") + "/")):
        rel = rel[len(root):]
    return Path(point) / rel.lstrip("/")


def _own_cgroup(proc_cgroup: str, mountinfo: str, controller: str = "memory") -> tuple[Path, int] | None:
    """This process's cgroup folder for a v1 controller (`memory`, `blkio`) and its version (the v1
    hierarchy first, else the unified one), or None."""
    lines = [line.split(":", 2) for line in proc_cgroup.splitlines() if line.count(":") >= 2]
    mounts = _mounts(mountinfo)
    for hierarchy, controllers, rel in lines:
        v1 = controller in controllers.split(",")
        for root, point, fstype, opts in mounts:
            if v1 and fstype == "cgroup" and controller in opts.split(","):
                return _folder(point, root, rel), 1
    for hierarchy, controllers, rel in lines:
        if hierarchy == "0" and controllers == "":
            for root, point, fstype, _ in mounts:
                if fstype == "cgroup2":
                    return _folder(point, root, rel), 2
    return None


def read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return UNLIMITED if text == "max" else int(text)


def _stat(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.count(" ") == 1)}
    except (OSError, ValueError):
        return {}


def read_cgroup(folder: Path, version: int, mount_root: Path | None = None) -> CgroupMemory | None:
    """The memory limit and usage of one cgroup folder (None: no limit, or unreadable)."""
    if version == 1:
        stat = _stat(folder / "memory.stat")
        limit = min(x for x in (read_int(folder / "memory.limit_in_bytes"), stat.get("hierarchical_memory_limit")) if x is not None) \
            if (folder / "memory.limit_in_bytes").exists() else None
        usage = read_int(folder / "memory.usage_in_bytes")
        cache = stat.get("total_inactive_file", stat.get("inactive_file", 0)) + stat.get("total_active_file", stat.get("active_file", 0))
    else:
        limits = []
        node = folder
        while True:  # memory.max of this cgroup and every ancestor below the mount point
            value = read_int(node / "memory.max")
            if value is not None:
                limits.append(value)
            if mount_root is None or node == mount_root or node.parent == node:
                break
            node = node.parent
        limit = min(limits) if limits else None
        usage = read_int(folder / "memory.current")
        cache = _stat(folder / "memory.stat").get("file", 0)
    if limit is None or usage is None or limit >= UNLIMITED:
        return None
    return CgroupMemory(folder, version, limit, usage, cache)


def own_cgroup_folder(controller: str = "memory") -> tuple[Path, int] | None:
    """(folder, version) of the cgroup this process runs in for a v1 controller's hierarchy, else the
    unified one (Linux); None elsewhere."""
    try:
        return _own_cgroup(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text(), controller)
    except OSError:
        return None


def own_cgroup_memory() -> CgroupMemory | None:
    """The memory cgroup this process runs in, if it has a limit (Linux); else None."""
    found = own_cgroup_folder()
    if found is None:
        return None
    folder, version = found
    mount_root = None
    if version == 2:
        mounts = _mounts(Path("/proc/self/mountinfo").read_text())
        mount_root = next((Path(p) for _, p, fstype, _ in mounts if fstype == "cgroup2"), None)
    return read_cgroup(folder, version, mount_root)


def ram_budget() -> RamBudget:
    """RAM this process may use in all: what it holds now (anonymous memory) plus what is available,
    RAM or, where a cgroup limit says less, the cgroup's room."""
    own = anon_rss() or 0
    available = int(psutil.virtual_memory().available)
    cgroup = own_cgroup_memory()
    if cgroup is not None and cgroup.available < available:
        return RamBudget(own + cgroup.available, f"cgroup limit {format_bytes(cgroup.limit)}")
    return RamBudget(own + available, "available RAM")


# --- this process's own footprint -------------------------------------------------------------
def _status_bytes(field: str) -> int | None:
    """A `kB` field of /proc/self/status in bytes (VmHWM: peak RSS, RssAnon, RssFile); None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss(counted_twice: int = 0) -> int:
    """The most resident memory this process has had (anonymous + mapped file pages), less
    `counted_twice`: bytes the kernel's count holds more than once — it counts every mapping of a
    page, and a streaming target's layers share a few slots (targets/direct_window.py)."""
    return max(0, (_status_bytes("VmHWM") or psutil.Process().memory_info().rss) - counted_twice)


def anon_rss() -> int | None:
    """Resident anonymous memory now: what the page cache cannot take back (None off Linux)."""
    return _status_bytes("RssAnon")


def disk_read_bytes() -> int | None:
    """Bytes this process has caused to be read from storage (page faults on mapped files included);
    None where the kernel does not say (/proc/self/io is Linux-only)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def process_cpu_seconds() -> float:
    """CPU time this process has used so far, user and system, all its threads (not its children)."""
    t = os.times()
    return t.user + t.system


def return_freed_memory() -> None:
    """Hand memory freed by models measured and dropped back to the OS (glibc keeps freed heap in
    its arenas: docs/measurements/code-notes.md, "The freed heap"), so a memory plan made next sees
    what the process really holds."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """glibc's free memory at the top of each arena handed back to the OS (no garbage collection first:
    cheap enough for a server after each large request; ctypes lets other threads run meanwhile)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 128 << 10  # glibc's default: larger blocks get an mmap of their own


def unmap_large_frees() -> bool:
    """Keep glibc's mmap threshold where it starts, so every block above 128 KiB is unmapped when
    freed; False where the C library is not glibc. Left to itself glibc raises the threshold to the
    size of each large block freed (up to 32 MiB), and blocks that size then come from the heap and
    stay there: 16-node trees' logits (~10 MB, float64 copies twice that), freed each round, grow
    a streaming run's anonymous memory, and the page cache gives up kept layers for it
    (docs/measurements/code-notes.md, "The freed heap"). Setting the threshold explicitly also turns
    glibc's raising off."""
    try:
        return ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    except (OSError, AttributeError):  # not glibc
        return False
