"""The Hugging Face cache: `<cache>/models--<org>--<repo>/snapshots/<revision>/<path>`, each file a
symbolic link to `../../blobs/<sha256>` (an LFS file's blob is named by the sha256 of its bytes).

Where, as huggingface_hub reads it: $HF_HUB_CACHE (or the older $HUGGINGFACE_HUB_CACHE), else
$HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. llama.cpp's
`-hf` downloads into the same layout (llama_cache.py). `refs/main` names the current revision; a
file in several snapshots is taken from the current one, else the newest. A download in progress
is `blobs/<sha256>.incomplete` and has no snapshot link yet. A model is named `hf:org/repo` when
the cache holds one GGUF of the repo, else `hf:org/repo:QUANT` or `hf:org/repo/<path>.gguf`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ondevice.catalog.stores.model import StoreModel, group_names, is_model_file
from ondevice.catalog.stores.reading import StoreUnreadable, entries, file_problem, is_dir, starts_as_gguf
from ondevice.files.gguf_split import part_paths

STORE = "HF cache"
PREFIX = "hf:"
REPO_FOLDER = "models--"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def roots() -> list[Path]:
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return [Path(env[var]).expanduser()]
    if env.get("HF_HOME"):
        return [Path(env["HF_HOME"]).expanduser() / "hub"]
    return [Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface" / "hub"]


def scan(root: Path, store: str = STORE) -> list[StoreModel]:
    """The GGUF models of every model repo cached under `root`, and a row for each partial GGUF download."""
    if not is_dir(root):
        return []
    models = []
    for folder in entries(root, store):
        if folder.name.startswith(REPO_FOLDER) and is_dir(folder):
            models += repo_models(folder, folder.name[len(REPO_FOLDER):].replace("--", "/"), store)
    return group_names(models, PREFIX)


def repo_models(folder: Path, repo: str, store: str) -> list[StoreModel]:
    files: dict[str, Path] = {}  # path in the repo -> the file, from the current snapshot first
    for snapshot in _snapshots(folder, store):
        for path in _gguf_files(snapshot, store):
            files.setdefault(path.relative_to(snapshot).as_posix(), path)
    models = [model_at(path, name, repo, store) for name, path in sorted(files.items()) if is_model_file(path)]
    blobs = folder / "blobs"
    partial = sorted(p for p in blobs.glob("*.incomplete") if starts_as_gguf(p)) if is_dir(blobs) else []
    for path in partial:  # no name yet: the link is made when the download is complete
        models.append(StoreModel(store, f"{PREFIX}{repo} (partial download)", path, _size(path), keys=frozenset({f"partial:{repo.lower()}"}),
                                 problem=f"a partial download ({path.name}); finish it with `hf download {repo}`"))
    return models


def _snapshots(folder: Path, store: str) -> list[Path]:
    """The repo's snapshot folders, the one refs/main names first, then the newest."""
    snapshots = folder / "snapshots"
    found = [p for p in entries(snapshots, store) if is_dir(p)] if is_dir(snapshots) else []
    try:
        current = (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        current = ""
    return sorted(found, key=lambda p: (p.name != current, -_mtime(p)))


def _gguf_files(snapshot: Path, store: str) -> list[Path]:
    """The .gguf entries under a snapshot (links included, linked folders not followed)."""
    problems: list[OSError] = []
    found = [Path(top) / name for top, _, names in os.walk(snapshot, onerror=problems.append) for name in names
             if name.lower().endswith(".gguf")]
    if problems:
        raise StoreUnreadable(f"{store}'s folder {problems[0].filename} cannot be read ({problems[0].strerror})")
    return sorted(found)


def model_at(path: Path, name: str, repo: str, store: str) -> StoreModel:
    full = f"{PREFIX}{repo}/{name}"
    parts = part_paths(path)
    problem = next((f"{part.name} is {why}" for part in parts if (why := file_problem(part)) is not None), None)
    keys = {k.lower() for k in (full, f"{repo}/{name}", PREFIX + repo, repo)}
    return StoreModel(store, full, path, sum(map(_size, parts)) if problem is None else 0, keys=frozenset(keys), group=repo,
                      digest=blob_digest(path), problem=problem)


def blob_digest(path: Path) -> str | None:
    """The sha256 a snapshot file's blob is named by (an LFS file): the blob its link names, or the
    one it finally resolves to; None for a plain file or a git blob."""
    try:
        targets = [Path(os.readlink(path))] if path.is_symlink() else []
    except OSError:
        targets = []
    for target in targets + [Path(os.path.realpath(path))]:
        if target.parent.name == "blobs" and _SHA256.fullmatch(target.name):
            return target.name
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
