"""llama.cpp's cache: where `llama-cli -hf` / `llama-server -hf` keep what they download.

Where (llama.cpp's `fs_get_cache_directory`, common/common.cpp): $LLAMA_CACHE, else on Linux
$XDG_CACHE_HOME/llama.cpp or ~/.cache/llama.cpp, on macOS ~/Library/Caches/llama.cpp, on Windows
%LOCALAPPDATA%\\llama.cpp. Until 2026 `-hf owner/repo` saved `<owner>_<repo>_<file>.gguf` there,
flat (a download in progress: `<file>.downloadInProgress`); now it uses the Hugging Face cache's
layout (common/hf-cache.cpp) in $LLAMA_CACHE when set, else in the Hugging Face cache itself
(hf_cache.py lists that). Flat files are named `llama.cpp:<file>.gguf`; the Hugging Face layout's
as in the Hugging Face cache, `hf:org/repo`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ondevice.catalog.stores import hf_cache
from ondevice.catalog.stores.model import StoreModel, is_model_file
from ondevice.catalog.stores.reading import entries, file_problem, is_dir
from ondevice.files.gguf_split import part_paths

STORE = "llama.cpp"
PREFIX = "llama.cpp:"
IN_PROGRESS = ".downloadInProgress"


def roots() -> list[Path]:
    if os.environ.get("LLAMA_CACHE"):
        return [Path(os.environ["LLAMA_CACHE"]).expanduser()]
    if sys.platform == "darwin":
        return [Path.home() / "Library" / "Caches" / "llama.cpp"]
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return [Path(os.environ["LOCALAPPDATA"]) / "llama.cpp"]
    return [Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "llama.cpp"]


def scan(root: Path) -> list[StoreModel]:
    if not is_dir(root):
        return []
    models = []
    for path in entries(root, STORE):
        if path.name.endswith(IN_PROGRESS) and path.name[: -len(IN_PROGRESS)].lower().endswith(".gguf"):
            name = path.name[: -len(IN_PROGRESS)]
            models.append(StoreModel(STORE, f"{PREFIX}{name} (partial download)", path, 0, keys=frozenset({f"partial:{name.lower()}"}),
                                     problem=f"a partial download ({path.name}); run llama.cpp's -hf again to finish it"))
        elif is_model_file(path) and not is_dir(path):
            models.append(model_at(path))
    return models + hf_cache.scan(root, STORE)  # the Hugging Face layout, when $LLAMA_CACHE holds it


def model_at(path: Path) -> StoreModel:
    stem = path.name[: -len(".gguf")]
    parts = part_paths(path)
    problem = next((f"{part.name} is {why}" for part in parts if (why := file_problem(part)) is not None), None)
    size = sum(part.stat().st_size for part in parts) if problem is None else 0
    keys = {k.lower() for k in (PREFIX + path.name, PREFIX + stem)}
    return StoreModel(STORE, PREFIX + path.name, path, size, keys=frozenset(keys), problem=problem)
