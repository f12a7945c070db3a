"""A GGUF model's header, read fast: its metadata scalars and where every tensor's bytes are.

`gguf.GGUFReader` parses every token string and tensor view, slowly
(docs/measurements/2026-11-28-ci-time.md); the memory plan and the target's prefetcher need only
the shapes and the tensor byte ranges, which this reads in well under a second (array values such
as the vocabulary are skipped; only their lengths are kept).

Layout (GGUF v2/v3): magic, version, tensor count, key/value count; the key/values; the tensor
infos (name, dims, type, offset relative to the data section); the data section, aligned to
`general.alignment` (32 by default). A split model (`…-00001-of-00003.gguf`, see gguf_split.py)
is read as one: metadata from the first part, tensors from every part, each with its file.

The file may come from anyone, so the reader trusts none of it: every length and count is checked
against the bytes left in the file before it is used (ggml's own reader keeps the same limits),
arrays of arrays are refused as llama.cpp refuses them, `general.alignment` must be a power of two,
and every tensor must have 1..4 dimensions of at least 1, a known type, whole blocks, and its bytes
right after the previous tensor's (padded to the alignment) and inside the file. Any of that is one
OndeviceError line. What llama.cpp would *abort* on in well-formed metadata is gguf_check.py's (and,
for the vocabulary, whose items it reads where `ArrayInfo.start` says, gguf_vocab.py's).
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.errors import OndeviceError
from ondevice.files.gguf_split import part_paths

GGUF_MAGIC = b"GGUF"  # a GGUF file's first four bytes
OUTPUT_LAYER = "output"  # the LM head, where a per-layer view of the file counts it as the last layer

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
# Limits on what a header may declare; llama.cpp's own reader (ggml/src/gguf.cpp) keeps the same ones.
MAX_KEY_BYTES = 65_535  # the GGUF spec's longest key
MAX_NAME_BYTES = 63  # GGML_MAX_NAME (64) less the terminating zero
MAX_STRING_BYTES = MAX_ARRAY_ITEMS = 1 << 30  # GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS
MAX_KEYS = 1 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
TOKENS_KEY = "tokenizer.ggml.tokens"


class ArrayInfo(NamedTuple):
    """An array value as the header keeps it: its length, element type and where its items start, not
    the items."""

    kind: str  # always "array"
    length: int
    element_type: int  # a GGUF value type (8: string)
    start: int = 0  # byte offset of its first item in the file (strings: each a u64 length, then its bytes)


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
    metadata: dict  # scalars and strings; an array appears as ArrayInfo("array", its length, its element type)
    tensors: dict[str, TensorRange]

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default=None):
        """`{arch}.{key}`, e.g. arch_value("block_count")."""
        return self.metadata.get(f"{self.arch}.{key}", default)

    @property
    def n_vocab(self) -> int:
        tokens = self.metadata.get(TOKENS_KEY)
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


class HeaderError(ValueError):
    """The header breaks a rule of the format (or a limit llama.cpp's reader keeps)."""


class _Cursor:
    """Reads a GGUF header from the mapped file: every length and count is checked against the bytes
    left before anything is read or allocated (a length of 2^63 is an error, not a MemoryError)."""

    def __init__(self, buf):
        self.buf, self.pos, self.size = buf, 0, len(buf)

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > self.size:
            raise EOFError("the header ends early")
        self.pos += size
        return struct.unpack_from(fmt, self.buf, self.pos - size)[0]

    def count(self, what: str, min_item_bytes: int, limit: int) -> int:
        """A u64 count of items of at least `min_item_bytes` each: at most `limit`, and they must fit in the file."""
        n = self.take("<Q")
        if n > limit or n * min_item_bytes > self.remaining():
            raise HeaderError(f"{what} is {n:,}, more than the {self.remaining():,} bytes left can hold")
        return n

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        return self.raw_string(what, limit).decode("utf-8", errors="replace")

    def raw_string(self, what: str, limit: int = MAX_STRING_BYTES) -> bytes:
        n = self.count(f"the length of {what}", 1, limit)
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos])

    def skip_strings(self, n: int, what: str) -> None:
        """Step over the next n strings, each length checked (a vocabulary: 150k of them, read fast)."""
        buf, pos, size, length_of = self.buf, self.pos, self.size, _U64.unpack_from
        for _ in range(n):
            if pos + 8 > size:
                raise EOFError("the header ends early")
            length = length_of(buf, pos)[0]
            pos += 8 + length
            if pos > size:
                raise HeaderError(f"the length of {what} is {length:,}, more than the bytes left")
        self.pos = pos

    def value(self, kind: int, key: str):
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string(_shown(key))
        if kind != _ARRAY:
            raise HeaderError(f"{_shown(key)} has the unknown value type {kind}")
        elem = self.take("<I")
        if elem not in _SCALARS and elem != _STRING:  # llama.cpp reads no array of arrays
            raise HeaderError(f"{_shown(key)} is an array of value type {elem}, which llama.cpp does not read")
        item_bytes = struct.calcsize(_SCALARS[elem]) if elem in _SCALARS else 8
        n = self.count(f"the length of {_shown(key)}", item_bytes, MAX_ARRAY_ITEMS)
        start = self.pos
        if elem in _SCALARS:
            self.pos += n * item_bytes
        else:
            self.skip_strings(n, f"an item of {_shown(key)}")
        return ArrayInfo("array", n, elem, start)


def _shown(text: str) -> str:
    """A name from the file as an error message shows it: quoted, at most 48 characters."""
    return repr(text if len(text) <= 48 else text[:48] + "…")


def read_header(path: str | Path) -> GGUFHeader:
    """The header of a GGUF model (every part of a split one), or an OndeviceError naming the fix."""
    path = Path(path).expanduser()
    parts = [_read_part(part) for part in part_paths(path)]
    tensors = {name: t for part in parts for name, t in part.tensors.items()}
    return GGUFHeader(path, parts[0].metadata, tensors)


def _read_part(path: Path) -> GGUFHeader:
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO or a device would block or never end
            raise OndeviceError(f"{path} is not a regular file; give the path of the .gguf model file.")
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size < 24:
                raise HeaderError("the file is too short")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, _Cursor(buf))
    except FileNotFoundError:
        raise OndeviceError(f"model file {path} does not exist; run `ondevice download` or check the path.") from None
    except IsADirectoryError:
        raise OndeviceError(f"{path} is a folder, not a GGUF model file; give the path of the .gguf file.") from None
    except OSError as err:
        raise OndeviceError(f"model file {path} cannot be read ({err.strerror}); check its permissions.") from None
    except (EOFError, ValueError, struct.error, KeyError) as err:
        raise OndeviceError(f"{path} is not a readable GGUF file ({err}); download it again.") from None


def _parse(path: Path, c: _Cursor) -> GGUFHeader:
    if c.buf[:4] != GGUF_MAGIC:
        raise HeaderError("no GGUF magic")
    c.pos = 4
    version = c.take("<I")
    if not 2 <= version <= 3:
        raise HeaderError(f"GGUF version {version} is not 2 or 3")
    n_tensors = c.take("<Q")
    n_kv = c.count("the number of metadata keys", 13, MAX_KEYS)  # a key of 1 byte: 8 + 1 + 4 + a 1-byte value
    if n_tensors * 29 > c.remaining():  # the smallest tensor info: 8 + 1 (name) + 4 + 4 + 8 + 4 (one dim)
        raise HeaderError(f"the number of tensors is {n_tensors:,}, more than the {c.remaining():,} bytes left can hold")
    metadata = {}
    for _ in range(n_kv):
        key = c.string("a metadata key", MAX_KEY_BYTES)
        if not key or key in metadata:
            raise HeaderError(f"metadata key {_shown(key)} is empty or repeated")
        metadata[key] = c.value(c.take("<I"), key)
    infos = [_tensor_info(c) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", 32)
    if isinstance(alignment, ArrayInfo) or not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderError(f"general.alignment {alignment!r} is not a power of two")
    data_offset = -(-c.pos // alignment) * alignment
    return GGUFHeader(path, metadata, _tensor_ranges(path, infos, data_offset, alignment, c.size))


def _tensor_info(c: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = c.string("a tensor name", MAX_NAME_BYTES)
    n_dims = c.take("<I")
    if n_dims > MAX_DIMS:
        raise HeaderError(f"tensor {_shown(name)} has {n_dims} dimensions (at most {MAX_DIMS})")
    dims = tuple(c.take("<Q") for _ in range(n_dims))
    return name, dims, c.take("<I"), c.take("<Q")


def _tensor_ranges(path: Path, infos, data_offset: int, alignment: int, file_size: int) -> dict[str, TensorRange]:
    """The tensors' byte ranges, checked as llama.cpp checks them: known types, whole blocks, each
    tensor right after the one before (padded to the alignment), all of it inside the file."""
    tensors, expected = {}, 0
    for name, dims, kind, offset in infos:
        if name in tensors:
            raise HeaderError(f"tensor {_shown(name)} appears twice")
        try:
            qtype = GGMLQuantizationType(kind)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise HeaderError(f"tensor {_shown(name)} has the unknown type {kind}") from None
        n = 1
        for d in dims:
            n *= d
            if not 1 <= d or n >= 1 << 62:
                raise HeaderError(f"tensor {_shown(name)} has the shape {dims}")
        if dims and dims[0] % block:
            raise HeaderError(f"tensor {_shown(name)} rows of {dims[0]} are not whole {qtype.name} blocks of {block}")
        nbytes = n // block * type_size
        if offset != expected or data_offset + offset + nbytes > file_size:
            raise HeaderError(f"tensor {_shown(name)} at offset {offset:,} ({nbytes:,} bytes) is not where the file holds it "
                              f"(expected {expected:,}; the file has {file_size:,} bytes)")
        expected = offset + -(-nbytes // alignment) * alignment
        tensors[name] = TensorRange(path, name, int(qtype), dims, data_offset + offset, nbytes)
    return tensors
