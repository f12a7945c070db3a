"""Well-formed GGUF files whose metadata llama.cpp asserts on: seeded mutants of a valid tiny model.

Where gguf_mutants.py breaks the format (lengths, counts, offsets), these stay valid GGUF — the
header reader has nothing to refuse — and change what llama.cpp's vocabulary and model loaders
trust: the tokenizer model (`llama`, `bert`, `rwkv`, …, with or without scores and merges), token
types (BYTE, CONTROL, values llama.cpp has no name for), NUL bytes in token texts, the RMS-norm
epsilon (negative, NaN, infinite, subnormal, of another type), and the alignment the tensors are
packed at (1..256 bytes, with the data section moved by padding keys). A SentencePiece
variant of the vocabulary (`<0x00>`…`<0xFF>` byte tokens) lets `llama` vocabularies load too.

`TEXT` holds every byte UTF-8 text can hold, for the child to tokenize (a SentencePiece vocabulary
without a byte token aborted there). `read_gguf` / `write_gguf` parse and write the whole file on their own (not with ondevice's reader,
which is what the tests check, nor with gguf-py, which would not write some of these files).
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY, INT32, UINT32, FLOAT32, FLOAT64 = 8, 9, 5, 4, 6, 12
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_BYTE = 1, 3, 6
TOKENIZER_MODELS = ["llama", "bert", "rwkv", "t5", "plamo2", "no_vocab", "none", "gpt2", "", "LLAMA", "gpt-2", "spm", "bpe\0x"]
# Text holding every byte UTF-8 text can hold (0..0x7f, the continuation bytes, every leading byte),
# so a tokenizer that falls back to byte tokens is asked for each of them.
TEXT = "hello world\n" + "".join(map(chr, [*range(0x800), 0x800, *range(0x1000, 0x10000, 0x1000), 0x10000, 0x40000, 0x80000,
                                            0xC0000, 0x100000]))
EPSILONS = [-1.0, -0.0, 0.0, math.nan, -math.nan, math.inf, -math.inf, 1e-45, 1e-38, 1e-6, 1.0, 1e30, -1e-6, 3.4e38]


@dataclass
class Gguf:
    """A GGUF file as values: key → (value type, value), the tensors (name, dims, type, bytes) in order."""

    kv: dict[str, tuple[int, object]]
    tensors: list[tuple[str, tuple[int, ...], int, bytes]] = field(default_factory=list)

    @property
    def arch(self) -> str:
        return self.kv["general.architecture"][1].decode()


def read_gguf(data: bytes) -> Gguf:
    pos = 0

    def take(fmt: str):
        nonlocal pos
        value = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return value

    def string() -> bytes:
        nonlocal pos
        n = take("<Q")
        pos += n
        return data[pos - n : pos]

    def value(kind: int):
        if kind == STRING:
            return string()
        if kind == ARRAY:
            elem, n = take("<I"), take("<Q")
            return elem, [value(elem) for _ in range(n)]
        return take(_SCALAR[kind])

    assert data[:4] == b"GGUF"
    pos = 4
    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string().decode()
        kind = take("<I")
        kv[key] = (kind, value(kind))
    infos = []
    for _ in range(n_tensors):
        name = string().decode()
        dims = tuple(take("<Q") for _ in range(take("<I")))
        infos.append((name, dims, take("<I"), take("<Q")))
    alignment = kv.get("general.alignment", (UINT32, 32))[1]
    start = -(-pos // alignment) * alignment
    ends = [offset for _, _, _, offset in infos[1:]] + [len(data) - start]
    tensors = [(name, dims, kind, data[start + offset : start + end]) for (name, dims, kind, offset), end in zip(infos, ends)]
    return Gguf(kv, [(name, dims, kind, blob) for name, dims, kind, blob in tensors])


def _nbytes(dims: tuple[int, ...], kind: int) -> int:
    """Bytes of a tensor of F32 (0), F16 (1) or the other types the tiny models hold."""
    n = math.prod(dims)
    return n * {0: 4, 1: 2, 30: 2}[kind]


def write_gguf(model: Gguf, alignment: int = 32) -> bytes:
    """The file: the tensors packed at `alignment` (general.alignment is written as the model's kv says)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(model.tensors), len(model.kv)))

    def string(text: bytes) -> bytes:
        return struct.pack("<Q", len(text)) + text

    def value(kind: int, item) -> bytes:
        if kind == STRING:
            return string(item)
        if kind == ARRAY:
            elem, items = item
            return struct.pack("<IQ", elem, len(items)) + b"".join(value(elem, x) for x in items)
        return struct.pack(_SCALAR[kind], item)

    for key, (kind, item) in model.kv.items():
        out += string(key.encode()) + struct.pack("<I", kind) + value(kind, item)
    offset, blobs = 0, []
    for name, dims, kind, blob in model.tensors:
        blob = blob[: _nbytes(dims, kind)]
        out += string(name.encode()) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", kind, offset)
        blobs.append(blob + bytes(-len(blob) % alignment))
        offset += len(blobs[-1])
    out += bytes(-len(out) % alignment)
    return bytes(out) + b"".join(blobs)


# --- the mutations -----------------------------------------------------------------------------------


def as_sentencepiece(model: Gguf) -> None:
    """The vocabulary as a SentencePiece (`llama`) one: tokens 0..255 become `<0x00>`…`<0xFF>` of type
    BYTE, and the merges go (llama.cpp's SPM tokenizer reads scores, not merges)."""
    _, tokens = model.kv["tokenizer.ggml.tokens"][1]
    _, types = model.kv["tokenizer.ggml.token_type"][1]
    tokens, types = list(tokens), list(types)
    for b in range(256):
        tokens[b], types[b] = b"<0x%02X>" % b, TOKEN_BYTE
    model.kv["tokenizer.ggml.tokens"] = (ARRAY, (STRING, tokens))
    model.kv["tokenizer.ggml.token_type"] = (ARRAY, (INT32, types))
    model.kv["tokenizer.ggml.model"] = (STRING, b"llama")
    model.kv.pop("tokenizer.ggml.merges", None)
    model.kv.pop("tokenizer.ggml.pre", None)
    model.kv["tokenizer.ggml.scores"] = (ARRAY, (FLOAT32, [-float(i) for i in range(len(tokens))]))


def _tokenizer_model(model: Gguf, rng: random.Random) -> str:
    name = rng.choice(TOKENIZER_MODELS)
    model.kv["tokenizer.ggml.model"] = (STRING, name.encode())
    if rng.random() < 0.5:
        model.kv.pop("tokenizer.ggml.merges", None)
    if rng.random() < 0.5:
        n = len(model.kv["tokenizer.ggml.tokens"][1][1])
        model.kv["tokenizer.ggml.scores"] = (ARRAY, (FLOAT32, [rng.uniform(-10, 0) for _ in range(n)]))
    return f"tokenizer.ggml.model = {name!r}"


def _token_types(model: Gguf, rng: random.Random) -> str:
    _, types = model.kv["tokenizer.ggml.token_type"][1]
    types, changed = list(types), []
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(types))
        types[i] = rng.choice([TOKEN_BYTE, TOKEN_BYTE, TOKEN_CONTROL, 0, 2, 4, 5, 7, 100, -1, 2**31 - 1])
        changed.append((i, types[i]))
    model.kv["tokenizer.ggml.token_type"] = (ARRAY, (INT32, types))
    return f"token types {changed}"


def _nul_in_token(model: Gguf, rng: random.Random) -> str:
    _, tokens = model.kv["tokenizer.ggml.tokens"][1]
    tokens = list(tokens)
    i = rng.randrange(len(tokens))
    at = rng.randint(0, len(tokens[i]))
    tokens[i] = rng.choice([tokens[i][:at] + b"\0" + tokens[i][at:], b"\0", tokens[i][:at] + b"\0"])
    model.kv["tokenizer.ggml.tokens"] = (ARRAY, (STRING, tokens))
    return f"token {i} = {tokens[i]!r}"


def _epsilon(model: Gguf, rng: random.Random) -> str:
    key = f"{model.arch}.attention.{rng.choice(['layer_norm_rms_epsilon', 'layer_norm_rms_epsilon', 'layer_norm_epsilon'])}"
    kind = rng.choice([FLOAT32, FLOAT32, FLOAT32, FLOAT64, INT32, UINT32, STRING])
    eps = rng.choice(EPSILONS)
    if kind in (INT32, UINT32):
        eps = int(eps) if math.isfinite(eps) and 0 <= eps < 2**31 else rng.choice([0, 1, 2**31 - 1])
    model.kv[key] = (kind, str(eps).encode() if kind == STRING else eps)
    return f"{key} = {eps!r} (type {kind})"


def _alignment(model: Gguf, rng: random.Random) -> tuple[str, int]:
    alignment = rng.choice([1, 1, 2, 4, 8, 16, 32, 64, 128, 256])
    model.kv["general.alignment"] = (UINT32, alignment)
    pad = rng.randrange(0, 40)
    model.kv["general.padding"] = (STRING, b"p" * pad)  # moves the data section by `pad` bytes
    return f"general.alignment = {alignment}, header padded by {pad}", alignment


MUTATIONS = [_tokenizer_model, _token_types, _nul_in_token, _epsilon]


def model_mutants(data: bytes, seed: int, n: int):
    """n (label, bytes) well-formed mutants of the valid GGUF `data`, the same for the same seed: one
    or two of the mutations above, the alignment changed in a third of them, a SentencePiece
    vocabulary in a quarter."""
    rng = random.Random(seed)
    for i in range(n):
        model = read_gguf(data)
        labels, alignment = [], 32
        if rng.random() < 0.25:
            as_sentencepiece(model)
            labels.append("sentencepiece vocabulary")
        for mutate in rng.sample(MUTATIONS, rng.choice([1, 1, 2])):
            labels.append(mutate(model, rng))
        if rng.random() < 0.35:
            label, alignment = _alignment(model, rng)
            labels.append(label)
        yield f"{i}: " + "; ".join(labels), write_gguf(model, alignment)
