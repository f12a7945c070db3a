"""Tokenizers of other kinds for the tiny models (write_tiny_gguf's vocab_edit), so that a drafter and a
target differ in vocabulary as Gemma 3 and Qwen2.5 do, while their weights still agree on text.

Each edit gives every new token the embedding row of the old token of the same bytes (or a random
row where there is none), so a drafter written with the target's seed (plus noise) predicts the same
text the target does whenever it tokenizes it the same way:

- `shuffled_bpe`: byte-level BPE with every id moved, the last `drop` letter-pair merges gone (tokens
  the target has and the drafter lacks) and `extra` three-letter merges added (the drafter's own).
- `sentencepiece`: a SentencePiece vocabulary as Gemma's: <unk>, <s>, </s>, "▁" for the space, the
  printable ASCII characters, the letter pairs (merged by score in the target's merge order), and
  the 256 byte-fallback tokens `<0xNN>`, which spell the same bytes as some ordinary tokens.
"""

from __future__ import annotations

import string

import numpy as np

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def _old_id_by_bytes(tokens: list[str]) -> dict[bytes, int]:
    """The tiny byte-level vocabulary's ids by the bytes they spell (byte token id = byte value)."""
    found = {bytes([b]): b for b in range(256)}
    for i, t in enumerate(tokens[256:], start=256):
        if all(c in string.ascii_lowercase for c in t):
            found[t.encode()] = i
    return found


def shuffled_bpe(drop: int = 13, extra: int = 10, seed: int = 0):
    def edit(tokens, types, merges):
        kept = len(merges) - drop
        pairs = [m.replace(" ", "") for m in merges[:kept]]
        triples = [p + "x" for p in pairs[:extra]]
        new_tokens = tokens[:256] + pairs + triples + ["<|endoftext|>"]
        new_types = [NORMAL] * (len(new_tokens) - 1) + [CONTROL]
        new_merges = merges[:kept] + [f"{p} x" for p in pairs[:extra]]
        old = {t: i for i, t in enumerate(tokens)}
        rows = [old.get(t, -1) for t in new_tokens]
        order = np.random.default_rng(seed).permutation(len(new_tokens))
        return {"tokens": [new_tokens[i] for i in order], "types": [new_types[i] for i in order],
                "merges": new_merges, "rows": [rows[i] for i in order], "model": "gpt2"}

    return edit


def sentencepiece():
    def edit(tokens, types, merges):
        by_bytes = _old_id_by_bytes(tokens)
        chars = [c for c in string.printable[:94]]  # digits, letters, punctuation: no whitespace
        pairs = [m.replace(" ", "") for m in merges]
        new_tokens = ["<unk>", "<s>", "</s>", "▁", *chars, *pairs, *[f"<0x{b:02X}>" for b in range(256)]]
        new_types = [UNKNOWN, CONTROL, CONTROL] + [NORMAL] * (1 + len(chars) + len(pairs)) + [BYTE] * 256
        scores = [0.0, 0.0, 0.0, -1000.0, *[-1000.0] * len(chars), *[-float(r) for r in range(len(pairs))], *[-2000.0] * 256]
        spelled = [b"", b"", b"", b" ", *[c.encode() for c in chars], *[p.encode() for p in pairs], *[bytes([b]) for b in range(256)]]
        rows = [by_bytes.get(s, -1) if s else -1 for s in spelled]
        rows[2] = len(tokens) - 1  # </s>: the target's <|endoftext|> row
        return {"tokens": new_tokens, "types": new_types, "scores": scores, "rows": rows, "model": "llama"}

    return edit
