"""A byte-level BPE vocabulary of any size that llama.cpp accepts, for models with random weights.

The 256 byte tokens in GPT-2's byte-to-unicode spelling (token id = byte value), then merges of
lowercase letter pairs ("a a" → "aa", …) while there is room, then filler tokens "[id]", and one
control token `<|endoftext|>` (the last id) used as BOS and EOS. Text round-trips through it; it is
only there so a synthetic GGUF loads and tokenizes like a real one.
"""

from __future__ import annotations

import string

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
LETTER_PAIRS = [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]


def byte_tokens() -> list[str]:
    """The 256 byte tokens, token id = byte value, spelled with GPT-2's bytes_to_unicode table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return [spelling[b] for b in range(256)]


def synthetic_vocab(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) for `vocab_size` ids (at least 258); the last id is <|endoftext|>."""
    if vocab_size < 258:
        raise ValueError("a byte-level vocabulary needs at least 258 ids")
    pairs = LETTER_PAIRS[: vocab_size - 257]
    fillers = [f"[{i}]" for i in range(256 + len(pairs), vocab_size - 1)]
    tokens = byte_tokens() + pairs + fillers + ["<|endoftext|>"]
    types = [TOKEN_NORMAL] * (vocab_size - 1) + [TOKEN_CONTROL]
    return tokens, types, [f"{p[0]} {p[1]}" for p in pairs]
