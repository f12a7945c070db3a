"""The folder downloads go to: writable, with room for the download, one writer per file at a time."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ondevice.errors import OndeviceError
from ondevice.sizes import format_bytes

try:
    import fcntl  # download lock
except ImportError:  # Windows
    fcntl = None

MIN_MARGIN, MAX_MARGIN = 1 << 20, 256 << 20


def check_writable(folder: Path) -> None:
    """The folder exists and takes files, or an OndeviceError saying where to download instead (a
    read-only home was a traceback)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise OndeviceError(f"cannot download into {folder} ({err.strerror}); set ONDEVICE_HOME to a writable folder with free space") from None


def check_free_space(folder: Path, needed: int) -> None:
    """An OndeviceError unless `needed` bytes plus a margin fit in `folder`. The margin (markers, state
    files, the disk's other users) is 1/16 of the download, at least 1 MiB and at most 256 MiB: a
    fixed 256 MiB refuses a 0.7 MB pair on a disk with 200 MB free."""
    needed += min(max(needed // 16, MIN_MARGIN), MAX_MARGIN)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OndeviceError(f"not enough disk space in {folder}: {format_bytes(needed)} needed, {format_bytes(free)} free; "
                            "free some space or set ONDEVICE_HOME to another disk")


@contextmanager
def download_lock(path: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold an exclusive lock on <file>.lock so two processes never write the same download
    (on_wait() is called once if another process holds it).

    The lock file stays (removing it would race); the OS drops the lock when a process dies.
    Without fcntl (Windows) there is no lock: run one download at a time there.
    """
    if fcntl is None:
        yield
        return
    with path.with_name(path.name + ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield
