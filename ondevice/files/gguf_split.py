"""A GGUF model stored as one file or as a split set (`name-00001-of-00003.gguf`, …), read as one.

llama.cpp's `gguf-split` (and gguf-py's writer with `split_max_*`) writes the metadata into the first
part and the tensors across all parts; every part carries `split.no` / `split.count`. llama.cpp
loads a set from the path of its first part; so do our readers (`gguf_reader.open_model`), with the
names and paths of the parts from here.
"""

from __future__ import annotations

import re
from pathlib import Path

from ondevice.errors import OndeviceError

SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_count(name: str) -> int:
    """How many parts the set named by its first part has (1: not a split name)."""
    match = SPLIT_NAME.match(Path(name).name)
    return int(match["count"]) if match else 1


def part_names(name: str) -> list[str]:
    """The names of every part of the set whose first part is `name` (just [name] if not split).
    A directory prefix in `name` is kept ("dir/x-00001-of-00002.gguf" → "dir/x-00002-of-00002.gguf")."""
    folder, _, base = name.rpartition("/")
    match = SPLIT_NAME.match(base)
    if not match:
        return [name]
    count = int(match["count"])
    if count == 0:
        raise OndeviceError(f"{base} is named as part {int(match['no'])} of 0 parts; a split GGUF has 1 or more parts: rename the file.")
    if int(match["no"]) != 1:
        raise OndeviceError(f"{base} is part {int(match['no'])} of a split GGUF: give the first part (…-00001-of-{match['count']}.gguf).")
    prefix = f"{folder}/" if folder else ""
    return [f"{prefix}{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def part_paths(path: str | Path) -> list[Path]:
    """Local paths of every part of the model whose (first) file is `path`."""
    path = Path(path)
    return [path.with_name(name) for name in part_names(path.name)]


def model_bytes(path: str | Path) -> int:
    """Size on disk of the whole model (all parts)."""
    return sum(part.stat().st_size for part in part_paths(path))


def set_problem(path: str | Path) -> str | None:
    """Why the model whose (first) file is `path` cannot be used as a whole, in words (a bad split name,
    parts missing); None if every part is there."""
    try:
        parts = part_paths(path)
    except OndeviceError as err:
        return str(err)
    missing = [part.name for part in parts if not part.is_file()]
    if missing:
        return f"{len(missing)} of its {len(parts)} parts missing ({missing[0]}{', …' if len(missing) > 1 else ''})"
    return None
