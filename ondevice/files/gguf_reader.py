"""A GGUF model, one file or a split set, read as one with gguf-py after our own header check.

`open_model(path)` returns a `SplitReader` whose `fields` come from the first part and whose
`tensors` are those of every part, each with the path of the file that holds its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from ondevice.errors import OndeviceError
from ondevice.files.gguf_check import check_model_file
from ondevice.files.gguf_split import part_paths


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
        self.path = Path(path).expanduser()
        self.parts = part_paths(self.path)
        missing = [part.name for part in self.parts if not part.is_file()]
        if missing:
            raise OndeviceError(
                f"No GGUF file at {self.path.parent / missing[0]}" + (f" ({len(missing)} of {len(self.parts)} parts missing)" if len(self.parts) > 1 else "")
                + ": check the path or run `ondevice download`."
            )
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
