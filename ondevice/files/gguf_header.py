"""A GGUF model's header, read fast: its metadata scalars and where every tensor's bytes are.

`gguf.GGUFReader` parses everything (every token string, every tensor view) and takes 10+ s on a
1 GB file here; the memory plan and the target's prefetcher need only the shapes and the tensor
byte ranges, which this reads in well under a second (array values such as the vocabulary are
skipped; only their lengths are kept).

Layout (GGUF v2/v3): magic, version, tensor count, key/value count; the key/values; the tensor
infos (name, dims, type, offset relative to the data section); the data section, aligned to
`general.alignment` (32 by default). A split model (`…-00001-of-00003.gguf`, see gguf_split.py)
is read as one: metadata from the first part, tensors from every part, each with its file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import part_paths

OUTPUT_LAYER = "output"  # the LM head, where a per-layer view of the file counts it as the last layer

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorRange:
    path: Path  # the file (part) that holds its bytes
    name: str
    qtype: int  # GGMLQuantizationType value
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.qtype).name  # e.g. "Q4_K"


@dataclass(frozen=True)
class GGUFHeader:
    path: Path  # the (first) file
    metadata: dict  # scalars and strings; an array appears as ("array", its length)
    tensors: dict[str, TensorRange]

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default=None):
        """`{arch}.{key}`, e.g. arch_value("block_count")."""
        return self.metadata.get(f"{self.arch}.{key}", default)

    @property
    def n_vocab(self) -> int:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, tuple):
            return int(tokens[1])
        embd = self.tensors.get("token_embd.weight")
        return embd.shape[1] if embd else 0

    def layer_ranges(self) -> dict[int, list[TensorRange]]:
        """Tensors of each decoder block (`blk.{i}.…`), in file order."""
        layers: dict[int, list[TensorRange]] = {}
        for t in sorted(self.tensors.values(), key=lambda t: t.offset):
            parts = t.name.split(".")
            if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
                layers.setdefault(int(parts[1]), []).append(t)
        return layers


class _Cursor:
    def __init__(self, f):
        self.f = f

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        raw = self.f.read(size)
        if len(raw) != size:
            raise EOFError("the header ends early")
        return struct.unpack(fmt, raw)[0]

    def string(self) -> str:
        n = self.take("<Q")
        return self.f.read(n).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.f.seek(self.take("<Q"), 1)

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            elem, n = self.take("<I"), self.take("<Q")
            if elem in _SCALARS:
                self.f.seek(n * struct.calcsize(_SCALARS[elem]), 1)
            else:
                for _ in range(n):
                    self.skip_array_item(elem)
            return ("array", n)
        raise ValueError(f"unknown GGUF value type {kind}")

    def skip_array_item(self, kind: int) -> None:
        if kind == _STRING:
            self.skip_string()
        else:
            self.value(kind)


def read_header(path: str | Path) -> GGUFHeader:
    """The header of a GGUF model (every part of a split one), or an OndeviceError naming the fix.
    A file's header is parsed once per process while its size and mtime stay the same (a load
    asks for it many times; a 151k-token vocabulary takes ~0.6 s to skip on 2 cores)."""
    path = Path(path).expanduser()
    parts = [_read_part_once(part) for part in part_paths(path)]
    tensors = {name: t for part in parts for name, t in part.tensors.items()}
    return GGUFHeader(path, parts[0].metadata, tensors)


_PARSED: dict[tuple[str, int, int], GGUFHeader] = {}


def _read_part_once(path: Path) -> GGUFHeader:
    try:
        st = path.stat()
    except OSError:
        return _read_part(path)  # let it say what is wrong
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _PARSED:
        _PARSED[key] = _read_part(path)
    return _PARSED[key]


def _read_part(path: Path) -> GGUFHeader:
    try:
        with path.open("rb", buffering=1 << 20) as f:
            return _parse(path, _Cursor(f))
    except FileNotFoundError:
        raise OndeviceError(f"model file {path} does not exist; run `ondevice download` or check the path.") from None
    except (EOFError, ValueError, struct.error, KeyError) as err:
        raise OndeviceError(f"{path} is not a readable GGUF file ({err}); download it again.") from None


def _parse(path: Path, c: _Cursor) -> GGUFHeader:
    if c.f.read(4) != b"GGUF":
        raise ValueError("no GGUF magic")
    version = c.take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        metadata[key] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = tuple(c.take("<Q") for _ in range(c.take("<I")))
        kind, offset = c.take("<I"), c.take("<Q")
        infos.append((name, dims, kind, offset))
    alignment = int(metadata.get("general.alignment", 32))
    data_offset = -(-c.f.tell() // alignment) * alignment
    tensors = {}
    for name, dims, kind, offset in infos:
        qtype = GGMLQuantizationType(kind)
        block, type_size = GGML_QUANT_SIZES[qtype]
        n = 1
        for d in dims:
            n *= d
        tensors[name] = TensorRange(path, name, int(qtype), dims, data_offset + offset, n // block * type_size)
    return GGUFHeader(path, metadata, tensors)
