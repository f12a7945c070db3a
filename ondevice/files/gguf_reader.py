"""A GGUF model, one file or a split set, read as one: its metadata scalars and its tensors, with
each tensor's bytes mapped from the file that holds them.

`open_model(path)` returns a `SplitReader` whose `fields` come from the first part and whose
`tensors` are those of every part, each with the path of the file that holds its bytes. Tensors look
as gguf-py's `ReaderTensor`s do (name, tensor_type, shape innermost first, n_bytes, data_offset,
data: the bytes as an array, float types as floats, quantized rows as uint8), but the header is read
by `gguf_header.read_header`, which skips the vocabulary's items: gguf-py's reader parses every
token string (docs/measurements/2026-11-28-ci-time.md). Array fields (the vocabulary) are not
read: their `contents()` is an error; tokenizers read them elsewhere (gguf_vocab.py, llama.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from ondevice.errors import OndeviceError
from ondevice.files.gguf_check import check_model_file
from ondevice.files.gguf_header import ArrayInfo, read_header
from ondevice.files.gguf_split import part_paths

_FLOATS = {
    GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}  # fmt: skip


@dataclass(frozen=True)
class Field:
    """One metadata value, as gguf-py's ReaderField answers `contents()`."""

    key: str
    value: object

    def contents(self):
        if isinstance(self.value, ArrayInfo):
            raise OndeviceError(f"metadata {self.key} is an array, which this reader does not read.")
        return self.value


@dataclass(frozen=True, eq=False)
class PartTensor:
    """A tensor of the model and the part file that holds its bytes."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: innermost dimension first
    n_bytes: int
    data_offset: int  # absolute, in `path`
    path: Path
    file: np.memmap  # the part's bytes, mapped read-only

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes mapped read-only: floats and ints as such (numpy order), quantized types as
        uint8 rows of blocks."""
        dims = tuple(reversed(self.shape))
        kind = _FLOATS.get(self.tensor_type)
        if kind is None:  # as gguf-py shapes quantized rows
            kind, dims = np.uint8, quant_shape_to_byte_shape(dims, self.tensor_type)
        raw = self.file[self.data_offset : self.data_offset + self.n_bytes]
        return raw.view(kind).reshape(dims)


class SplitReader:
    """The `fields` and `tensors` of all parts of a model (tensors know their part's path)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.parts = part_paths(self.path)
        missing = [part.name for part in self.parts if not part.is_file()]
        if missing:
            raise OndeviceError(
                f"No GGUF file at {self.path.parent / missing[0]}" + (f" ({len(missing)} of {len(self.parts)} parts missing)" if len(self.parts) > 1 else "")
                + ": check the path or run `ondevice download`."
            )
        check_model_file(self.path)  # what llama.cpp would abort on in well-formed metadata
        header = read_header(self.path)
        self.fields = {key: Field(key, value) for key, value in header.metadata.items()}
        files = {part: np.memmap(part, mode="r") for part in {t.path for t in header.tensors.values()}}
        self.tensors = [PartTensor(t.name, GGMLQuantizationType(t.qtype), t.shape, t.nbytes, t.offset, t.path, files[t.path])
                        for t in header.tensors.values()]  # fmt: skip
        expected = header.metadata.get("split.tensors.count")
        if expected is not None and int(expected) != len(self.tensors):
            raise OndeviceError(f"{self.path.name}: the split set holds {len(self.tensors)} tensors, its header says {int(expected)}; download it again.")


def open_model(path: str | Path) -> SplitReader:
    """A reader over the model whose (first) file is `path`, or a one-line OndeviceError."""
    return SplitReader(path)
