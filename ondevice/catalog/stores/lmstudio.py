"""LM Studio's store: `<models>/<publisher>/<model>/*.gguf`, the files as downloaded from the Hugging Face Hub.

Where: the folder `~/.lmstudio-home-pointer` names (LM Studio writes it; `<home>/models`), else
~/.lmstudio/models, and older installs' ~/.cache/lm-studio/models. A model is named
`lmstudio:<publisher>/<model>` when its folder holds one GGUF, else `lmstudio:<publisher>/<model>:QUANT`
or `lmstudio:<publisher>/<model>/<file>.gguf`. Vision projectors (`mmproj-*.gguf`) and the later
parts of a split model are not models of their own.
"""

from __future__ import annotations

from pathlib import Path

from ondevice.catalog.stores.model import StoreModel, group_names, is_model_file
from ondevice.catalog.stores.reading import entries, file_problem, is_dir
from ondevice.files.gguf_split import part_paths

STORE = "LM Studio"
PREFIX = "lmstudio:"


def roots() -> list[Path]:
    home = Path.home()
    found = []
    pointer = home / ".lmstudio-home-pointer"
    try:
        named = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    except (OSError, UnicodeDecodeError):
        named = ""
    if named:
        found.append(Path(named).expanduser() / "models")
    return found + [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def scan(root: Path) -> list[StoreModel]:
    if not is_dir(root):
        return []
    models = []
    for publisher in _folders(root):
        for folder in _folders(publisher):
            group = f"{publisher.name}/{folder.name}"
            for path in entries(folder, STORE):
                if is_model_file(path):
                    models.append(model_at(path, group))
    return group_names(models, PREFIX)


def _folders(folder: Path) -> list[Path]:
    return [p for p in entries(folder, STORE) if is_dir(p) and not p.name.startswith(".")]


def model_at(path: Path, group: str) -> StoreModel:
    """The model whose (first) file is `path` in the folder `group` (publisher/model)."""
    full = f"{PREFIX}{group}/{path.name}"
    parts = part_paths(path)
    problem = next((f"{part.name} is {why}" for part in parts if (why := file_problem(part)) is not None), None)
    size = sum(part.stat().st_size for part in parts) if problem is None else 0
    keys = {k.lower() for k in (full, f"{group}/{path.name}", PREFIX + group, group)}
    return StoreModel(STORE, full, path, size, keys=frozenset(keys), group=group, problem=problem)
