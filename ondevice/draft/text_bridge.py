"""The target's context as the drafter of another tokenizer reads it: the same text, its own tokens.

The engine gives a drafter the committed context in target ids. A drafter of another vocabulary
reads the bytes of those tokens (special tokens spelled out: "<|im_start|>" is plain text to it)
tokenized by its own tokenizer. Re-tokenizing the whole context every round would cost ~2.5 ms
per KB of text here (Gemma 3's tokenizer), so `TextBridge` re-tokenizes only the tail: it keeps
marks (k target tokens ↔ m drafter tokens of the same text) at word and line starts, where both
kinds of tokenizer split anyway, and from the last mark the context still shares, tokenizes the new
text in two pieces, up to a new mark ≥ TAIL target tokens before the end, and the rest. Tokens the
drafter drafted and the target accepted are re-tokenized like any other text, so the drafter's KV
cache (which keeps its longest common prefix) always holds a tokenization of the real context.

Text that ends inside a UTF-8 character (a target token holding the first bytes of one) has no
drafter tokenization that ends where the target's does: `convert` then gives None (no draft this
round). Bytes that are not UTF-8 mid-context reach the drafter as U+FFFD.
"""

from __future__ import annotations

import codecs
from typing import Sequence

from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.tree import common_prefix

TAIL = 16  # target tokens after the last mark, re-tokenized every round (a word never straddles a mark)
LONG_RUN = 256  # a run this long without a word or line start gets a mark anyway


class TextBridge:
    def __init__(self, target: Tokenizer, drafter: Tokenizer):
        self.target_tok, self.drafter_tok = target, drafter
        self.start = [drafter.bos_id] if drafter.add_bos and drafter.bos_id >= 0 else []
        self.reset()

    def reset(self) -> None:
        self.target: list[int] = []  # the target ids converted last
        self.pieces: list[bytes] = []  # their bytes
        self.drafter: list[int] = list(self.start)  # their text in drafter ids
        self.marks: list[tuple[int, int]] = [(0, len(self.start))]  # (k, m): drafter[:m] is the text of target[:k]

    def convert(self, context: Sequence[int]) -> list[int] | None:
        """The drafter's ids for the text of `context` (target ids); None when that text ends inside a character."""
        context = [int(t) for t in context]
        shared = common_prefix(self.target, context)
        while self.marks[-1][0] > shared:
            self.marks.pop()
        k0, m0 = self.marks[-1]
        pieces = self.pieces[:shared] + [self.target_tok.piece(t, special=True) for t in context[shared:]]
        split = self._split(pieces, k0)
        head = self._encode(b"".join(pieces[k0:split]), final=True)[0] if split > k0 else []
        tail, complete = self._encode(b"".join(pieces[split:]), final=False)
        self.target, self.pieces = context, pieces
        self.drafter = self.drafter[:m0] + head + tail
        if split > k0:
            self.marks.append((split, m0 + len(head)))
        return self.drafter if complete and self.drafter else None

    def _split(self, pieces: list[bytes], k0: int) -> int:
        """Where the next mark goes: the last word or line start at least TAIL tokens before the end (k0: none)."""
        last = len(pieces) - TAIL
        for k in range(last, k0, -1):
            if pieces[k][:1] in (b" ", b"\n", b"\t") or pieces[k - 1][-1:] == b"\n":
                return k
        return last if last - k0 >= LONG_RUN else k0

    def _encode(self, data: bytes, final: bool) -> tuple[list[int], bool]:
        """The drafter's tokens of `data`, and whether it ended on a whole character (else, unless
        `final`, its last bytes, the start of one, are left out)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(data, final=final)
        complete = not decoder.getstate()[0]
        ids = self.drafter_tok.encode(text, add_special=False, parse_special=False) if text else []
        return ids, complete
