"""A GGUF model stored as one file or as a split set (`name-00001-of-00003.gguf`, …), read as one.

llama.cpp's `gguf-split` (and gguf-py's writer with `split_max_*`) writes the metadata into the first
part and the tensors across all parts; every part carries `split.no` / `split.count`. llama.cpp
loads a set from the path of its first part. Here `open_model(path)` does the same for our own
readers: it returns a `SplitReader` whose `fields` come from the first part and whose `tensors`
are those of every part, each with the path of the file that holds its bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    if int(match["no"]) != 1:
        raise OndeviceError(f"{base} is part {int(match['no'])} of a split GGUF: give the first part (…-00001-of-{match['count']}.gguf).")
    count = int(match["count"])
    prefix = f"{folder}/" if folder else ""
    return [f"{prefix}{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def part_paths(path: str | Path) -> list[Path]:
    """Local paths of every part of the model whose (first) file is `path`."""
    path = Path(path)
    return [path.with_name(name) for name in part_names(path.name)]


def model_bytes(path: str | Path) -> int:
    """Size on disk of the whole model (all parts)."""
    return sum(part.stat().st_size for part in part_paths(path))


@dataclass(frozen=True)
class PartTensor:
    """A tensor of a split set: gguf's ReaderTensor plus the part file that holds it."""

    tensor: Any  # gguf.ReaderTensor
    path: Path

    def __getattr__(self, name: str):
        return getattr(self.tensor, name)


class SplitReader:
    """gguf.GGUFReader's `fields` and `tensors` over all parts of a model (tensors gain `.path`)."""

    def __init__(self, path: str | Path):
        import gguf

        self.path = Path(path).expanduser()
        self.parts = part_paths(self.path)
        missing = [part.name for part in self.parts if not part.is_file()]
        if missing:
            raise OndeviceError(
                f"No GGUF file at {self.path.parent / missing[0]}" + (f" ({len(missing)} of {len(self.parts)} parts missing)" if len(self.parts) > 1 else "")
                + ": check the path or run `ondevice download`."
            )
        from ondevice.files.gguf_check import check_model_file

        check_model_file(self.path)  # gguf-py trusts the header's lengths and counts: check them first
        readers = []
        for part in self.parts:
            try:
                readers.append(gguf.GGUFReader(part))
            except Exception as err:  # bad magic, truncated file
                raise OndeviceError(f"{part} is not a readable GGUF file ({err}): download it again.") from err
        self.fields = readers[0].fields
        self.tensors = [PartTensor(t, part) for reader, part in zip(readers, self.parts) for t in reader.tensors]
        expected = readers[0].fields.get("split.tensors.count")
        if expected is not None and int(expected.contents()) != len(self.tensors):
            raise OndeviceError(f"{self.path.name}: the split set holds {len(self.tensors)} tensors, its header says {int(expected.contents())}; download it again.")


def open_model(path: str | Path) -> SplitReader:
    """A reader over the model whose (first) file is `path`, or a one-line OndeviceError."""
    return SplitReader(path)
