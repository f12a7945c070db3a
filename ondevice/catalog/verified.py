"""The `<file>.verified` marker beside a downloaded model file, and how a cached file is checked
before each use.

Hashing a model in full at every start costs seconds per gigabyte (minutes for a 40 GB target), so a
file whose sha256 was checked gets a marker; before this marker also recorded the inode's change
time, a byte flipped in place with its mtime set back (`touch -d`, `os.utime`, `cp -p`, `rsync -t`)
passed as the verified file. Now:

- When a file's sha256 is checked in full (download, `ondevice download --force`, a stale marker),
  the marker records the digest and where it came from, the file's size, mtime, ctime and inode, and
  `sample`: the sha256 of `SAMPLE_BLOCKS` blocks of `SAMPLE_BYTES` spread evenly over the file, the
  first and the last included (the whole file when it is smaller than that: 4 MiB).
- Before each use, a cached file passes if size, mtime, ctime and inode equal the marker's (one
  stat) and its sampled blocks hash to `sample` (4 MiB read: milliseconds from the page cache).
  Anything else means a full sha256 again: the file is used if it still matches (a copied or
  restored file: new inode and ctime) and downloaded again if not.
- Why this catches a flipped byte with the mtime restored: any write, and setting the mtime itself,
  moves the ctime, which only the kernel sets. What it does not catch is a change below the
  filesystem that leaves the ctime alone (a failing disk, a write to the raw device) in a block it
  does not sample; `ondevice download --force` hashes every byte again. On filesystems without a
  real ctime (Windows reports the creation time) the sample is what is left.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ondevice import paths

SAMPLE_BLOCKS = 64
SAMPLE_BYTES = 64 << 10
STAT_FIELDS = ("size", "mtime_ns", "ctime_ns", "inode")


def marker_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def file_state(stat: os.stat_result) -> dict[str, int]:
    """What a marker must match before the sample is even read: size, mtime, ctime, inode."""
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino}


def sample_offsets(size: int) -> list[int]:
    """Where the sampled blocks start: evenly spread, the first at 0 and the last ending at the end."""
    if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
        return list(range(0, size, SAMPLE_BYTES))
    last = size - SAMPLE_BYTES
    return [last * i // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS)]


def sampled_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in sample_offsets(size):
            f.seek(offset)
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def write_marker(path: Path, sha256: str, source: str) -> None:
    """Record that `path` as it is now has this digest (checked in full just now), and where the digest came from."""
    record = {"sha256": sha256, "source": source, **file_state(path.stat()), "sample": sampled_digest(path)}
    paths.write_json(marker_path(path), record)  # a read-only or full home: a warning, and the next run hashes again


def read_marker(path: Path) -> dict | None:
    """The marker's record ({sha256, source, size, …}), or None if there is none (or it is damaged)."""
    return paths.read_state(marker_path(path), _checked_record, "verification record")


def is_fresh(path: Path, record: dict) -> bool:
    """Whether the record describes the file as it is on disk now (one stat, nothing read). False for
    a marker written by an older ondevice (no ctime, inode or sample) and for a file changed since."""
    try:
        state = file_state(path.stat())
    except OSError:
        return False
    return all(record.get(k) == v for k, v in state.items())


def sample_matches(path: Path, record: dict) -> bool:
    """The before-use check's second half: the sampled blocks hash as when the file was verified."""
    try:
        return sampled_digest(path) == record.get("sample")
    except OSError:
        return False


def _checked_record(data) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("sha256"), str):
        raise TypeError("expected {sha256, source, size, mtime_ns, ...}")
    return data
