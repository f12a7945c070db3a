"""The Hugging Face Hub as a source of model files: reachability, the hub's digests, downloads.

Everything goes through `huggingface_hub` (no hand-written HTTP): `get_hf_file_metadata` for a
file's size and digest (an LFS file's `X-Linked-Etag` is the sha256 of its bytes), `hf_hub_download`
into a staging folder beside the final path (it resumes from there), `HfApi.list_repo_tree` to pick
a file by quantization for `hf:owner/repo:Q4_K_M`. The caller (hub.py) verifies and places files.
huggingface_hub (and tqdm) are imported where a file is asked of the hub, not with this module: a load
of files already here leaves their memory to the page cache.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import urllib.parse
from functools import cache
from pathlib import Path

from rich.progress import Progress, TaskID

from ondevice import paths
from ondevice.catalog.pairs import ModelFile, Part
from ondevice.errors import OndeviceError, first_line
from ondevice.files.gguf_split import SPLIT_NAME

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
HUB_PROBE_TIMEOUT_S = 3.0
SHA256 = re.compile(r"[0-9a-f]{64}")


class SourceFailed(Exception):
    """One source could not deliver a file; the next source is tried."""


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_HF_ENDPOINT).rstrip("/")


def require_hub() -> str:
    """The hub endpoint, or SourceFailed (one line) if it is switched off or does not answer."""
    url = endpoint()
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
        raise SourceFailed("offline (HF_HUB_OFFLINE is set)")
    if not _hub_reachable(url):
        raise SourceFailed(f"unreachable ({url})")
    return url


def check_reachable(what: str) -> None:
    """A one-line OndeviceError naming the network when the hub cannot be reached to get `what`."""
    try:
        require_hub()
    except SourceFailed as err:
        raise OndeviceError(
            f"cannot download {what}: the Hugging Face Hub is {err}; check your network connection "
            "(or HF_ENDPOINT / HF_HUB_OFFLINE), or pass a local GGUF file instead"
        ) from None


@cache
def _hub_reachable(url: str) -> bool:
    """One TCP connect to the endpoint, at most HUB_PROBE_TIMEOUT_S (DNS included); cached per process."""
    parts = urllib.parse.urlsplit(url)
    address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
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


def staging_dir(path: Path) -> Path:
    """hf_hub_download's local_dir for this file (it keeps its resume metadata there)."""
    return path.with_name(f".{path.name}.hf")


# ---------------------------------------------------------------------------------------------
# Digests and downloads


def with_hub_digests(model_file: ModelFile, parts: list[Part]) -> list[Part]:
    """The parts with size and sha256 filled in from the hub's file metadata where the catalog
    does not pin them. SourceFailed if the hub does not answer or gives no sha256 for a file."""
    url = require_hub()
    filled = []
    for part in parts:
        if part.sha256 is not None and part.size is not None:
            filled.append(part)
            continue
        try:
            from huggingface_hub import get_hf_file_metadata, hf_hub_url  # lazy (module docstring)

            meta = get_hf_file_metadata(hf_hub_url(model_file.hf_repo, part.hf_file, revision=model_file.hf_revision, endpoint=url))
        except Exception as err:  # whatever the client raises (not found, gated, HTTP error): this source cannot deliver
            raise SourceFailed(f"{model_file.hf_repo}/{part.hf_file}: {first_line(err)}") from err
        digest = (meta.etag or "").strip('"').lower()
        if not SHA256.fullmatch(digest):
            raise SourceFailed(
                f"the hub gives no sha256 for {model_file.hf_repo}/{part.hf_file} (etag {meta.etag!r}: not an LFS file), "
                "so it cannot be checked"
            )
        if meta.size is None:
            raise SourceFailed(f"the hub gives no size for {model_file.hf_repo}/{part.hf_file}")
        filled.append(Part(part.file, part.hf_file, meta.size, digest))
    return filled


def download(model_file: ModelFile, part: Part, progress: Progress, task: TaskID) -> Path:
    """hf_hub_download one part into its staging folder, advancing `task`; returns the staged file."""
    final = paths.inside(paths.models_dir(), part.file, f"{model_file.hf_repo}/{part.hf_file}")
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        from huggingface_hub import hf_hub_download  # lazy (module docstring)

        staged = hf_hub_download(
            model_file.hf_repo, part.hf_file, revision=model_file.hf_revision,
            local_dir=staging_dir(final), endpoint=require_hub(), tqdm_class=_bar_into(progress, task),
        )
    except SourceFailed:
        raise
    except Exception as err:  # whatever the hub client raises, this source did not deliver
        raise SourceFailed(first_line(err)) from err
    return Path(staged)


def _bar_into(progress: Progress, task: TaskID) -> type:
    """A tqdm class for hf_hub_download that draws nothing itself and advances one rich task, so a
    split model's parts fill one bar."""
    from tqdm.auto import tqdm  # lazy (module docstring)

    class TaskBar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            progress.advance(task, kwargs.get("initial") or 0)  # bytes resumed from an earlier run

        def update(self, n=1):
            progress.advance(task, n or 0)
            return super().update(n)

    return TaskBar


# ---------------------------------------------------------------------------------------------
# Choosing a file by quantization, as llama.cpp's `-hf owner/repo:Q4_K_M`


def file_for_quant(repo: str, quant: str, revision: str = "main") -> str:
    """The GGUF in `repo` for quantization `quant` (case-insensitive; the first part of a split set).
    One-line OndeviceError if the hub cannot be reached or no (or more than one) file matches."""
    try:
        url = require_hub()
    except SourceFailed as err:
        raise OndeviceError(
            f"cannot look up {repo}:{quant}: the Hugging Face Hub is {err}; check your network connection, or pass a local GGUF file"
        ) from None
    try:
        from huggingface_hub import HfApi  # lazy (module docstring)

        names = [entry.path for entry in HfApi(endpoint=url).list_repo_tree(repo, revision=revision, recursive=True) if hasattr(entry, "size")]
    except Exception as err:
        raise OndeviceError(f"cannot list the files of {repo} on the Hugging Face Hub: {first_line(err)}") from None
    return pick_quant(names, quant, repo)


def pick_quant(names: list[str], quant: str, repo: str) -> str:
    """From a repo's file names, the one GGUF model file of this quantization (first part if split)."""
    token = re.compile(rf"(^|[-._]){re.escape(quant)}([-._]|$)", re.IGNORECASE)
    models = {}  # repo path of each model (a split set by its first part) -> its name without the part suffix
    for name in names:
        base = name.rsplit("/", 1)[-1]
        split = SPLIT_NAME.match(base)
        if base.lower().endswith(".gguf") and "mmproj" not in base.lower() and (not split or int(split["no"]) == 1):
            models[name] = split["stem"] + ".gguf" if split else base
    candidates = [name for name, base in models.items() if token.search(base.removesuffix(".gguf"))]
    if not candidates:
        listed = ", ".join(sorted(models.values())[:12]) or "none"
        raise OndeviceError(f"{repo} has no GGUF file for quantization {quant}; its GGUF files: {listed}")
    if len(candidates) > 1:
        raise OndeviceError(f"{repo} has several GGUF files for {quant} ({', '.join(candidates)}); name one: hf:{repo}/FILE")
    return candidates[0]
