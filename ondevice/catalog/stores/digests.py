"""A file a store names by its sha256 (an ollama blob, an LFS blob of the Hugging Face cache):
checked in full once, before its first use, and the check recorded as our own downloads' are.

The record is the `.verified` marker of catalog/verified.py (digest, where it came from, size, mtime,
ctime, inode and a sampled hash), kept in `<home>/stores/verified/<sha256>.json` instead of beside
the file: the store is never written. Before each later use the check is the one our downloads
get: one stat and 4 MiB of sampled blocks; a file changed since (or a record missing, or damaged)
is hashed in full again. A file whose bytes do not match its name is refused in one line, and left
where it is for its own program to fetch again.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from ondevice import paths
from ondevice.catalog import verified
from ondevice.catalog.hub import ChecksumMismatch, verify_file
from ondevice.catalog.pairs import Part
from ondevice.errors import OndeviceError
from ondevice.sizes import format_bytes


def record_path(digest: str) -> Path:
    return paths.state_file("stores/verified", f"{digest}.json")  # a digest from a store's file names: checked to stay there


def is_checked(path: Path, digest: str) -> bool:
    """The file was checked against `digest` and has not changed since (one stat, 4 MiB read)."""
    record = paths.read_state(record_path(digest), _record_for(digest), "verification record")
    return record is not None and verified.is_fresh(path, record) and verified.sample_matches(path, record)


def check_once(path: Path, digest: str, store: str, label: str, console: Console) -> None:
    """Return if `path` has the sha256 `digest` (hashed now unless a fresh record says so); else a
    one-line OndeviceError naming the store to fetch it again with."""
    if is_checked(path, digest):
        return
    console.print(f"{label}: checking the sha256 of its {store} file once ({format_bytes(path.stat().st_size)})",
                  markup=False, highlight=False, soft_wrap=True)
    try:
        verify_file(path, Part(path.name, None, None, digest), console)
    except ChecksumMismatch as err:
        raise OndeviceError(f"{label}: {err}; its {store} copy is damaged: fetch it again with {store}") from None
    paths.write_json(record_path(digest), {"sha256": digest, "source": store, **verified.file_state(path.stat()),
                                           "sample": verified.sampled_digest(path)})


def _record_for(digest: str):
    def parse(data) -> dict:
        if not isinstance(data, dict) or data.get("sha256") != digest:
            raise TypeError(f"expected the record of {digest[:12]}…")
        return data

    return parse
