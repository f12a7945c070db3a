"""Malformed GGUF files for tests: the named cases (each a way a GGUF file can be malformed), and seeded mutants of a valid tiny model.

`header_fields(data)` walks a valid GGUF header on its own (not with ondevice's reader, which is what
the tests check) and lists every integer field: counts, lengths, value types, scalar values, dims,
tensor types and offsets. `mutants(data, seed, n)` sets such fields to hostile values (0, 2^k ± 1,
2^63, "negative"), flips bytes in the header and truncates the file.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_UNSIGNED = {"<B": 8, "<H": 16, "<I": 32, "<Q": 64, "<b": 8, "<h": 16, "<i": 32, "<q": 64}


@dataclass(frozen=True)
class Field:
    offset: int
    fmt: str  # struct format of the field
    label: str  # what it is, e.g. "kv llama.block_count value", "tensor 3 dim 1"


def header_fields(data: bytes) -> tuple[list[Field], int, list[str]]:
    """Every integer field of the header, where the header ends, and the tensors' names."""
    fields: list[Field] = []
    pos = 0

    def take(fmt: str, label: str):
        nonlocal pos
        value = struct.unpack_from(fmt, data, pos)[0]
        if fmt in _UNSIGNED:
            fields.append(Field(pos, fmt, label))
        pos += struct.calcsize(fmt)
        return value

    def string(label: str) -> str:
        nonlocal pos
        n = take("<Q", f"{label} length")
        text = data[pos : pos + n].decode("utf-8", "replace")
        pos += n
        return text

    pos = 4
    take("<I", "version")
    n_tensors, n_kv = take("<Q", "n_tensors"), take("<Q", "n_kv")
    for k in range(n_kv):
        key = string(f"key {k}")
        kind = take("<I", f"kv {key} type")
        if kind == 8:
            string(f"kv {key} string")
        elif kind == 9:
            elem, n = take("<I", f"kv {key} element type"), take("<Q", f"kv {key} array length")
            for i in range(n):
                label = f"kv {key} item {i}" if i < 4 else "item"  # a few items of each array, not all 320 tokens
                string(label) if elem == 8 else take(_SCALAR[elem], label)
        else:
            take(_SCALAR[kind], f"kv {key} value")
    names = []
    for t in range(n_tensors):
        names.append(string(f"tensor {t} name"))
        for d in range(take("<I", f"tensor {t} n_dims")):
            take("<Q", f"tensor {t} dim {d}")
        take("<I", f"tensor {t} type")
        take("<Q", f"tensor {t} offset")
    return [f for f in fields if not f.label.startswith("item")], pos, names


def hostile_values(bits: int, original: int) -> list[int]:
    top = (1 << bits) - 1
    values = {0, 1, 2, 3, top, top >> 1, (top >> 1) + 1, original + 1, max(original - 1, 0), original * 2, 511, 512, 513}
    values |= {(1 << k) + d for k in (7, 8, 15, 16, 24, 31, 32, 40, 62, 63) for d in (-1, 0, 1) if k < bits}
    return sorted(v & top for v in values)


def mutants(data: bytes, seed: int, n: int):
    """n (label, bytes) mutants of the valid GGUF `data`, the same for the same seed."""
    rng = random.Random(seed)
    fields, header_end, _ = header_fields(data)
    for i in range(n):
        kind = rng.random()
        out = bytearray(data)
        if kind < 0.7:
            f = rng.choice(fields)
            bits = _UNSIGNED[f.fmt]
            fmt = f.fmt.upper() if f.fmt in ("<b", "<h", "<i", "<q") else f.fmt
            original = struct.unpack_from(fmt, data, f.offset)[0]
            value = rng.choice(hostile_values(bits, original))
            struct.pack_into(fmt, out, f.offset, value)
            yield f"{i}: {f.label} = {value}", bytes(out)
        elif kind < 0.9:
            flips = [(rng.randrange(4, header_end), rng.randrange(256)) for _ in range(rng.randint(1, 8))]
            for pos, byte in flips:
                out[pos] = byte
            yield f"{i}: bytes {flips}", bytes(out)
        else:
            cut = rng.randrange(0, len(data))
            yield f"{i}: truncated at {cut}", bytes(out[:cut])


def patch_field(data: bytes, label: str, value: int) -> bytes:
    """`data` with the field named `label` (see header_fields) set to `value`."""
    (f,) = [f for f in header_fields(data)[0] if f.label == label]
    out = bytearray(data)
    struct.pack_into(f.fmt.upper() if f.fmt in ("<b", "<h", "<i", "<q") else f.fmt, out, f.offset, value)
    return bytes(out)
