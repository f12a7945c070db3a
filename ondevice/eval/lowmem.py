"""Run a command as if the machine had less RAM, or a slower disk: the "model larger than memory" bench regime.

    python -m ondevice.eval.lowmem --cgroup 1.4GB -- ondevice generate "..." --json
    python -m ondevice.eval.lowmem --balloon 20GiB -- ondevice bench ...
    python -m ondevice.eval.lowmem --cgroup 0.9GB --read-bps 1GB -- ondevice bench ...

--cgroup LIMIT  (Linux, root or a delegated cgroup) runs the command in a memory cgroup of its own
    whose limit counts the command's page cache as well as its own memory: a model file larger than
    the limit must stream from disk, and nobody else on the machine is touched. The model files'
    cached pages are dropped first (a page already cached by another cgroup would be charged there
    and never re-read). After the run it reports the cgroup's peak usage, how often the limit was
    hit and whether the OOM killer acted, checks the limit held, and removes the cgroup.
--balloon SIZE  locks SIZE of RAM (mmap + mlock; root or CAP_IPC_LOCK) in a helper process, runs
    the command, and checks the balloon is still alive afterwards: if the kernel's OOM killer took
    it, the run was not constrained and is discarded (exit status 3). The balloon stops by itself
    after --timeout seconds or when this script dies. It squeezes every process on the machine, so
    keep it to a quiet machine.
--read-bps RATE  (with either, or alone) caps the command's reads from the disk holding the model
    files at RATE bytes a second (`slow_disk.py`): the disk-bound regime of a model many times larger
    than memory, the same in every run. Alone, it drops the model files' cached pages first too.

The report (one JSON object) goes to stderr, or to --report FILE; the command's own output is
untouched. Exit status: the command's, or 3 when the constraint did not hold.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from ondevice.errors import OndeviceError
from ondevice.eval.slow_disk import ReadThrottle, remove_cgroup, whole_disk
from ondevice.machine import ram
from ondevice.machine.facts import drop_page_cache
from ondevice.paths import home
from ondevice.sizes import format_bytes, parse_size

NOT_CONSTRAINED = 3
COLD_SLACK = 8 << 20  # a model file may keep this much cached (its header, read by the loader) and count as cold


# --- cgroup -----------------------------------------------------------------------------------
class MemoryCgroup:
    """A cgroup v1 or v2 memory cgroup of our own, below this process's (or at the hierarchy root)."""

    def __init__(self, limit: int, name: str | None = None):
        found = ram.own_cgroup_folder()
        if found is None:
            raise OndeviceError("no memory cgroup hierarchy is mounted here; use --balloon instead.")
        parent, self.version = found
        self.limit = limit
        self.folder = self._make(parent, name or f"ondevice-lowmem-{os.getpid()}")
        limit_file = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        (self.folder / limit_file).write_text(str(limit))
        self.limit = ram.read_int(self.folder / limit_file)  # the kernel rounds it to whole pages
        if self.version == 1 and (self.folder / "memory.memsw.limit_in_bytes").exists():
            (self.folder / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no escape into swap
        if self.version == 2 and (self.folder / "memory.swap.max").exists():
            (self.folder / "memory.swap.max").write_text("0")

    def _make(self, parent: Path, name: str) -> Path:
        """A new folder below our own cgroup, else below the nearest ancestor that lets us."""
        for base in (parent, *(p for p in parent.parents if (p / "cgroup.procs").exists())):
            try:
                if self.version == 2:  # children get the memory controller only if the parent hands it down
                    (base / "cgroup.subtree_control").write_text("+memory")
                (base / name).mkdir()
                return base / name
            except OSError:
                continue
        raise OndeviceError(
            f"cannot create a memory cgroup below {parent} (needs root or a delegated cgroup); use --balloon instead."
        )

    def join(self) -> None:
        """Move the calling process into the cgroup (run in the child before exec)."""
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def report(self) -> dict:
        if self.version == 1:
            peak = ram.read_int(self.folder / "memory.max_usage_in_bytes")
            hits = ram.read_int(self.folder / "memory.failcnt")
            limit = ram.read_int(self.folder / "memory.limit_in_bytes")
            oom = _keyed(self.folder / "memory.oom_control").get("oom_kill", 0)
        else:
            peak = ram.read_int(self.folder / "memory.peak")
            events = _keyed(self.folder / "memory.events")
            hits, oom = events.get("max", 0), events.get("oom_kill", 0)
            limit = ram.read_int(self.folder / "memory.max")
        stat = _keyed(self.folder / "memory.stat")
        return {"cgroup": str(self.folder), "limit_bytes": limit, "peak_usage_bytes": peak, "limit_hits": hits, "oom_kills": oom,
                "major_faults": stat.get("total_pgmajfault", stat.get("pgmajfault"))}

    def remove(self) -> None:
        remove_cgroup(self.folder)


def _keyed(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if len(line.split()) == 2)}
    except (OSError, ValueError):
        return {}


def model_files(command: Sequence[str] = ()) -> list[Path]:
    """The GGUF files a command here may map: downloaded models, kept synthetic ones, and those the
    command names (`--target FILE`, `--drafter=FILE`: a file of one's own outside the home)."""
    found = sorted((home() / "models").glob("*.gguf")) + sorted((home() / "synthetic" / "models").glob("*.gguf"))
    seen = {p.resolve() for p in found}
    for arg in command:
        path = Path(arg.split("=", 1)[-1])
        if path.suffix == ".gguf" and path.is_file() and path.resolve() not in seen:
            found.append(path)
            seen.add(path.resolve())
    return found


def cached_bytes(path: Path) -> int:
    """How much of the file the page cache holds now (mincore over a private mapping of it)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        anchor = ctypes.c_char.from_buffer(m)  # the mapping's address (nothing is written)
        try:
            failed = ctypes.CDLL(None, use_errno=True).mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        finally:
            del anchor
    return 0 if failed else sum(v & 1 for v in vec) * mmap.PAGESIZE


def _joining(*joins: Callable[[], None]) -> Callable[[], None]:
    """A preexec function that moves the child into every cgroup given."""
    def join() -> None:
        for j in joins:
            j()
    return join


def run_in_cgroup(command: list[str], limit: int, drop: list[Path], joins: Sequence[Callable[[], None]] = ()) -> tuple[int, dict]:
    """(exit status, report) of `command` run under a memory limit of `limit` bytes (and in the
    cgroups `joins` move it to). The files in `drop` leave the page cache first; what stays (another
    process maps it) is reported, since pages cached by another cgroup are not charged to ours and
    the run would not be constrained."""
    for path in drop:
        drop_page_cache(path)
    still_cached = {str(p): cached_bytes(p) for p in drop}
    cgroup = MemoryCgroup(limit)
    try:
        t0 = time.perf_counter()
        rc = subprocess.run(command, preexec_fn=_joining(cgroup.join, *joins)).returncode
        report = {"mode": "cgroup", "seconds": time.perf_counter() - t0, "returncode": rc, **cgroup.report(),
                  "cached_at_start_bytes": still_cached}
    finally:
        cgroup.remove()
    report["limit_held"] = report["limit_bytes"] == cgroup.limit and (report["peak_usage_bytes"] or 0) <= cgroup.limit
    report["cold_start"] = sum(still_cached.values()) <= COLD_SLACK * max(1, len(drop))
    return (rc if report["limit_held"] and report["cold_start"] else NOT_CONSTRAINED), report


# --- balloon ----------------------------------------------------------------------------------
BALLOON = r"""
import ctypes, mmap, os, sys, time
size, deadline, parent = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), os.getppid()
buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
libc = ctypes.CDLL(None, use_errno=True)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) != 0:
    sys.exit(f"mlock of {size} bytes failed: {os.strerror(ctypes.get_errno())} (needs root or CAP_IPC_LOCK)")
print("locked", flush=True)
while time.monotonic() < deadline and os.getppid() == parent:
    time.sleep(0.5)
"""


def start_balloon(size: int, timeout_s: float) -> subprocess.Popen:
    """A helper process holding `size` bytes of locked RAM until timeout_s or until we die."""
    balloon = subprocess.Popen([sys.executable, "-c", BALLOON, str(size), str(timeout_s)], stdout=subprocess.PIPE, text=True)
    line = balloon.stdout.readline().strip()  # blocks while the pages are faulted in and locked
    if line != "locked":
        balloon.wait()
        raise OndeviceError(f"the balloon could not lock {format_bytes(size)} (exit {balloon.returncode}); run as root or lock less.")
    return balloon


def _still_alive(process: subprocess.Popen, grace_s: float = 1.0) -> bool:
    """Whether the process is still running (waiting a moment: a kill takes effect asynchronously)."""
    try:
        process.wait(timeout=grace_s)
        return False
    except subprocess.TimeoutExpired:
        return True


def run_with_balloon(command: list[str], size: int, timeout_s: float, joins: Sequence[Callable[[], None]] = ()) -> tuple[int, dict]:
    balloon = start_balloon(size, timeout_s)
    try:
        t0 = time.perf_counter()
        available = ram.ram_budget().bytes
        env = {**os.environ, "ONDEVICE_BALLOON_PID": str(balloon.pid)}
        rc = subprocess.run(command, env=env, preexec_fn=_joining(*joins)).returncode
        alive = _still_alive(balloon)
        report = {"mode": "balloon", "balloon_bytes": size, "available_after_lock": available, "seconds": time.perf_counter() - t0,
                  "returncode": rc, "balloon_alive": alive, "limit_held": alive}
    finally:
        if balloon.poll() is None:
            balloon.terminate()
        balloon.wait()
    return (rc if report["limit_held"] else NOT_CONSTRAINED), report


def run_plain(command: list[str], drop: list[Path], joins: Sequence[Callable[[], None]] = ()) -> tuple[int, dict]:
    """`command` with no memory constraint (in the cgroups `joins` move it to), the files in `drop`
    out of the page cache first."""
    for path in drop:
        drop_page_cache(path)
    t0 = time.perf_counter()
    rc = subprocess.run(command, preexec_fn=_joining(*joins)).returncode
    return rc, {"mode": "plain", "seconds": time.perf_counter() - t0, "returncode": rc, "limit_held": True}


def run_throttled(throttle: ReadThrottle, run: Callable[[Sequence[Callable[[], None]]], tuple[int, dict]]) -> tuple[int, dict]:
    """`run` (a runner of the command, given the cgroups to join) with the command's reads capped;
    the report says the cap, and a cap the kernel did not hold makes the run unconstrained."""
    try:
        rc, report = run([throttle.join])
        held = throttle.held()
    finally:
        throttle.remove()
    report.update(disk=throttle.disk, read_bps=held, read_cap_held=held == throttle.bps)
    return (rc if held == throttle.bps else NOT_CONSTRAINED), report


# --- command line -----------------------------------------------------------------------------
def _runner(args: argparse.Namespace, command: list[str], files: list[Path]):
    """The run asked for (a memory cgroup, a balloon, or neither), as a function of the other cgroups
    its command joins."""
    drop = [] if args.no_drop else files
    if args.cgroup:
        return functools.partial(run_in_cgroup, command, parse_size(args.cgroup), drop)
    if args.balloon:
        return functools.partial(run_with_balloon, command, parse_size(args.balloon), args.timeout)
    return functools.partial(run_plain, command, drop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ondevice.eval.lowmem", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--cgroup", metavar="LIMIT", help="memory limit of a cgroup for the command, e.g. 1.4GB")
    mode.add_argument("--balloon", metavar="SIZE", help="lock this much RAM while the command runs, e.g. 20GiB")
    parser.add_argument("--read-bps", metavar="RATE", help="cap the command's reads from the models' disk at RATE bytes a second, e.g. 1GB")
    parser.add_argument("--timeout", type=float, default=3600.0, help="the balloon lets go after this many seconds")
    parser.add_argument("--no-drop", action="store_true", help="keep the model files' cached pages (cgroup or read cap)")
    parser.add_argument("--report", help="write the JSON report to this file instead of stderr")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not (args.cgroup or args.balloon or args.read_bps):
        parser.error("give --cgroup, --balloon or --read-bps")
    try:
        files = model_files(command)
        run = _runner(args, command, files)
        if args.read_bps:
            throttle = ReadThrottle(whole_disk(files[0] if files else home()), parse_size(args.read_bps.removesuffix("/s")))
            rc, report = run_throttled(throttle, run)
        else:
            rc, report = run([])
    except OndeviceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(report)
    if args.report:
        Path(args.report).write_text(text + "\n")
    else:
        print(text, file=sys.stderr)
    if not report.get("read_cap_held", True):
        print("the disk's read cap did not hold (the cgroup changed): discard this run.", file=sys.stderr)
    if not report["limit_held"]:
        print("the memory limit did not hold (the balloon died, or the cgroup changed): discard this run.", file=sys.stderr)
    elif not report.get("cold_start", True):
        print("model files stayed in the page cache (another process maps them): this run was not constrained; discard it.", file=sys.stderr)
    if report.get("oom_kills"):
        print(f"the kernel's OOM killer ended {report['oom_kills']} process(es) of the command: the limit is too small for it.", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
