"""What llama.cpp's vocabulary asserts on, checked in the file before llama.cpp sees it.

llama.cpp builds its vocabulary from `tokenizer.ggml.*` and trusts it: some mistakes end in an error
it returns, others in an abort (an assert, or a C++ exception thrown out of a C call) that kills the
whole process. Found with tests/gguf_model_mutants.py against the llama.cpp we ship:

- the tokenizer model: `rwkv` hung, `t5`, `none` and `no_vocab` aborted in `llama_tokenize`;
  `bert` aborts on a BYTE-type token (`token_to_byte`: "fatal error"). ondevice runs `gpt2` (byte-level
  BPE: Qwen, Llama 3) and `llama` (SentencePiece: Llama 2, Gemma, Phi-3) vocabularies.
- a SentencePiece vocabulary tokenizes a byte it has no piece for as the byte token `<0xXX>` (or the
  byte itself) and throws `std::out_of_range` if there is none: all 256 must be there; and it reads a
  BYTE-type token's value from its text (`<0xXX>`).
- a token text holding a NUL byte is cut there by llama.cpp's C strings, so two texts can become one:
  `GGML_ASSERT(id_to_token.size() == token_to_id.size())`. Two equal texts abort the same way (an
  empty text is renamed `[EMPTY_i]`, never equal to another).
- token types are llama.cpp's 0..6 (UNDEFINED … BYTE); other values are refused rather than guessed.

The items are read from the file where the header reader found the arrays (`ArrayInfo.start`).
"""

from __future__ import annotations

import mmap
import re
import struct

import numpy as np

from ondevice.files.gguf_header import TOKENS_KEY, ArrayInfo, GGUFHeader

TOKENIZERS = {"gpt2": "byte-level BPE", "llama": "SentencePiece"}
TOKEN_TYPES = range(7)  # LLAMA_TOKEN_TYPE_UNDEFINED .. LLAMA_TOKEN_TYPE_BYTE
TOKEN_BYTE = 6
_INT32, _FLOAT32, _STRING = 5, 6, 8  # GGUF value types
_BYTE_TOKEN = re.compile(rb"<0x[0-9A-Fa-f]{2}>")


def vocab_problem(header: GGUFHeader) -> str | None:
    """What in the vocabulary would make llama.cpp abort, in words; None if nothing."""
    metadata = header.metadata
    tokens, model = metadata.get(TOKENS_KEY), metadata.get("tokenizer.ggml.model")
    if tokens is None and model is None:
        return None  # no vocabulary: llama.cpp refuses the model itself, in an error it returns
    if model not in TOKENIZERS:
        shown = repr(model) if isinstance(model, str) else "missing" if model is None else "not a name"
        kinds = ", ".join(f"{name!r} ({what})" for name, what in TOKENIZERS.items())
        return f"tokenizer.ggml.model is {shown[:40]}; ondevice runs the tokenizers {kinds}"
    shape = _shape_problem(metadata)
    if shape:
        return shape
    with open(header.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        texts = _strings(buf, tokens)
        types_info = metadata.get("tokenizer.ggml.token_type")
        types = np.frombuffer(buf, "<i4", tokens.length, types_info.start).copy() if types_info is not None else None
    return _text_problem(texts) or _type_problem(texts, types, model) or (_byte_problem(texts) if model == "llama" else None)


def _shape_problem(metadata: dict) -> str | None:
    tokens = metadata.get(TOKENS_KEY)
    if not isinstance(tokens, ArrayInfo) or tokens.element_type != _STRING:
        return "tokenizer.ggml.tokens is missing or not a list of strings"
    for key, kinds in (("tokenizer.ggml.token_type", (_INT32,)), ("tokenizer.ggml.scores", (_INT32, _FLOAT32))):
        value = metadata.get(key)
        if value is not None and (not isinstance(value, ArrayInfo) or value.element_type not in kinds or value.length < tokens.length):
            return f"{key} does not hold a number for each of the {tokens.length:,} tokens"
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is not None and (not isinstance(merges, ArrayInfo) or merges.element_type != _STRING):
        return "tokenizer.ggml.merges is not a list of strings"
    return None


def _strings(buf, array: ArrayInfo) -> list[bytes]:
    """The array's strings (the header reader checked that they lie inside the file)."""
    out, pos, length_of = [], array.start, struct.Struct("<Q").unpack_from
    for _ in range(array.length):
        n = length_of(buf, pos)[0]
        out.append(buf[pos + 8 : pos + 8 + n])
        pos += 8 + n
    return out


def _text_problem(texts: list[bytes]) -> str | None:
    for i, text in enumerate(texts):
        if b"\0" in text:
            return f"token {i:,} holds a NUL byte ({text[:24]!r}), which llama.cpp cuts its text at"
    distinct = len({text or b"[EMPTY_%d]" % i for i, text in enumerate(texts)})
    if distinct != len(texts):
        return f"tokenizer.ggml.tokens lists {len(texts) - distinct:,} token texts twice"
    return None


def _type_problem(texts: list[bytes], types: np.ndarray | None, model: str) -> str | None:
    if types is None:
        return None
    unknown = np.flatnonzero((types < TOKEN_TYPES.start) | (types >= TOKEN_TYPES.stop))
    if unknown.size:
        return f"token {int(unknown[0]):,} has the type {int(types[unknown[0]])}, which llama.cpp does not know (0..6)"
    if model == "llama":
        for i in np.flatnonzero(types == TOKEN_BYTE):
            if not _BYTE_TOKEN.fullmatch(texts[i]):
                return f"token {int(i):,} is a BYTE token spelled {texts[i][:24]!r}, not <0xXX>"
    return None


def _byte_problem(texts: list[bytes]) -> str | None:
    """A SentencePiece vocabulary needs a piece for every byte: `<0xXX>`, or the byte itself."""
    present = set(texts)
    missing = [b for b in range(256) if b"<0x%02X>" % b not in present and (b == 0 or bytes([b]) not in present)]
    if missing:
        return f"the SentencePiece vocabulary has no byte token for {len(missing)} bytes (<0x{missing[0]:02X}> …)"
    return None
