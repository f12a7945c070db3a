"""What `--target`, `--drafter` and `ondevice download` accept besides catalog names: a model of your own.

- a local GGUF file (the first part of a split set): used as it is, nothing is downloaded;
- `hf:owner/repo/path/file.gguf`: that file of a Hugging Face repo;
- `hf:owner/repo:Q4_K_M` (or `hf:owner/repo`, meaning Q4_K_M): the repo's GGUF of that quantization,
  picked from the repo's file list as llama.cpp's `-hf` does.

A Hugging Face file is downloaded into `<models>/hf/<owner>/<repo>/` with the digest the hub gives
for it (checked and recorded, like a catalog entry with `sha256 = "hub"`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ondevice import paths
from ondevice.catalog import hf_source, hub
from ondevice.catalog.pairs import ModelFile
from ondevice.errors import OndeviceError

HF_PREFIX = "hf:"
DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's -hf default
_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"


@dataclass(frozen=True)
class HfRef:
    repo: str  # owner/name
    file: str | None  # path of the file in the repo, or None: choose by quant
    quant: str | None


def is_hf(text: str) -> bool:
    return text.startswith(HF_PREFIX)


def parse_hf(text: str) -> HfRef:
    """`hf:owner/repo/file.gguf` | `hf:owner/repo:QUANT` | `hf:owner/repo`, or a one-line OndeviceError."""
    body = text[len(HF_PREFIX):]
    if match := re.fullmatch(rf"({_REPO})/(.+\.gguf)", body, re.IGNORECASE):
        _check_parts(text, match[1] + "/" + match[2])
        return HfRef(match[1], match[2], None)
    if match := re.fullmatch(rf"({_REPO})(?::([\w.-]+))?", body):
        _check_parts(text, match[1])
        return HfRef(match[1], None, match[2] or DEFAULT_QUANT)
    raise OndeviceError(f"{text!r} is not a Hugging Face reference: write hf:owner/repo/file.gguf or hf:owner/repo:Q4_K_M.")


def text_of(ref: HfRef) -> str:
    return f"hf:{ref.repo}" + (f"/{ref.file}" if ref.file else f":{ref.quant}")


def check(text: str, flag: str) -> None:
    """Checked before anything is loaded or downloaded: the reference parses, a local file exists."""
    if is_hf(text):
        parse_hf(text)
    elif not Path(text).expanduser().is_file():
        raise OndeviceError(f"{flag} {text}: no such file; give a GGUF file or hf:owner/repo:QUANT.")


def _check_parts(text: str, path: str) -> None:
    if any(part in ("", ".", "..") for part in path.split("/")) or "\0" in path or "\\" in path:
        raise OndeviceError(f"{text!r}: the repo and the file path in it may not hold '.', '..', '\\', NUL or empty parts.")


def model_file(ref: HfRef) -> ModelFile:
    """The ModelFile of a Hugging Face reference (the hub is asked which file a quant names)."""
    file = ref.file or hf_source.file_for_quant(ref.repo, ref.quant)
    return ModelFile(
        label=f"{ref.repo}/{file}", file=f"hf/{ref.repo}/{file}", size=None, sha256=None, hf_repo=ref.repo, hf_file=file,
    )


def local_model(text: str, console: Console | None = None, force: bool = False) -> Path:
    """The local path of the model a --target/--drafter value names, downloading an hf: one if needed.
    force: rehash a downloaded hf: file against its recorded digest (and download it again if bad)."""
    if not is_hf(text):
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            raise OndeviceError(f"no GGUF file at {path}: check the path.")
        return path
    ref = parse_hf(text)
    here = downloaded(ref)  # no network needed for a file we already have: it is checked as any cached file is
    return hub.ensure_file(here or model_file(ref), console, force=force, announce_cached=False)


def downloaded(ref: HfRef) -> ModelFile | None:
    """The download of a reference, if there is one (a quant is matched among the repo's files
    downloaded here, as the hub's list would match it); hub.ensure_file checks it before use."""
    if ref.file is not None:
        candidates = [ref.file]
    else:
        folder = paths.inside(paths.models_dir(), f"hf/{ref.repo}", text_of(ref))
        names = [p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf")] if folder.is_dir() else []
        try:
            candidates = [hf_source.pick_quant(names, ref.quant, ref.repo)]
        except OndeviceError:
            return None
    found = model_file(HfRef(ref.repo, candidates[0], None))
    return found if hub.was_downloaded(found) else None
