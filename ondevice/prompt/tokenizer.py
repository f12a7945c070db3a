"""Text ↔ token ids and the chat template, read from a GGUF's own vocabulary (llama.cpp, vocab only).

Loading vocab-only touches no weights, so it is fast and safe on any CPU. Once the target is loaded
by llama.cpp from the same file, the tokenizer reads that model's vocabulary instead (`read_from`).
Where the target streams from disk it is loaded without one and the tokenizer lets go of its own
(`let_go`): the ~40 MB llama.cpp holds for a 152k-token vocabulary keep target layers in RAM
instead (docs/measurements/2026-12-07-vocabulary-once.md). It then keeps what decoding reads (each
token's bytes, the end tokens) and loads the vocabulary again for each encode.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import hashlib
import re
import threading
from pathlib import Path
from typing import Iterable

import llama_cpp
import numpy as np

from ondevice import llama_backend
from ondevice.prompt import chat_template, template_process
from ondevice.prompt.text import check_text
from ondevice.errors import OndeviceError
from ondevice.machine.ram import trim_heap


class Tokenizer:
    def __init__(self, gguf_path: str | Path):
        self.path = Path(gguf_path)
        self._lender: llama_backend.LlamaModel | None = None  # the loaded model whose vocabulary it reads (`read_from`)
        self._lean: _Pieces | None = None  # after `let_go`: what decoding reads, the vocabulary loaded again for the rest
        self._holding = threading.RLock()  # `held`
        self._model = llama_backend.load_vocab(self.path)
        self._vocab_handle = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab_handle)
        self.bos_id = llama_cpp.llama_vocab_bos(self._vocab_handle)
        self.eos_id = llama_cpp.llama_vocab_eos(self._vocab_handle)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab_handle))
        self.architecture = self._meta("general.architecture")
        template = llama_cpp.llama_model_chat_template(self._model, None)
        self.chat_template = template.decode("utf-8", errors="replace") if template else None  # bytes from the file: never trusted to be UTF-8

    def read_from(self, model: llama_backend.LlamaModel) -> None:
        """Read the vocabulary from `model`, a llama.cpp load of this same file (the target), and free
        this tokenizer's own vocab-only copy: one copy in RAM instead of two, as the memory plan counts
        (docs/measurements/2026-12-06-one-vocabulary.md). The model stays loaded until this tokenizer
        is closed too."""
        if model.source.resolve() != self.path.resolve():
            raise ValueError(f"{model.source.name} is not {self.path.name}: a tokenizer reads its own file's vocabulary")
        if self._lender is model:
            return
        vocab = model.lend_vocab(self)
        self.close()
        self._model, self._vocab_handle, self._lender, self._lean = model.handle, vocab, model, None

    @property
    def reads_from(self) -> llama_backend.LlamaModel | None:
        """The loaded model whose vocabulary it reads (`read_from`); None: its own vocab-only copy."""
        return self._lender

    def let_go(self) -> None:
        """Free the vocabulary now and keep what decoding reads: every token's bytes (`piece`) and the
        end tokens (`is_end`). Each `encode` (and any other question for the vocabulary) then loads it
        again for the call, a quarter of a second for a 152k-token one: for a target streaming from
        disk, whose passes take longer, and whose RAM holds its layers instead. Not for a tokenizer
        encoding during decoding (a drafter of another vocabulary: draft/cross_vocab.py)."""
        if self._lean is None:
            self._lean = _Pieces.read(self)
            self.close()
            trim_heap()

    @property
    def lets_go(self) -> bool:
        return self._lean is not None

    @contextlib.contextmanager
    def held(self):
        """The vocabulary loaded again for the block after `let_go` (many encodes, one load); one
        thread at a time (a server's requests encode in threads of their own)."""
        with self._holding:
            if self._lean is None or self._model is not None:
                yield
                return
            self._model = llama_backend.load_vocab(self.path)
            self._vocab_handle = llama_cpp.llama_model_get_vocab(self._model)
            try:
                yield
            finally:
                self.close()
                trim_heap()

    @contextlib.contextmanager
    def _vocab(self):
        """llama.cpp's vocabulary handle for a call: this tokenizer's, or one loaded for it after `let_go`."""
        with self.held():
            yield self._vocab_handle

    def close(self) -> None:
        """Let go of the vocabulary now (it is also freed at garbage collection)."""
        if getattr(self, "_lender", None) is not None:
            self._lender.vocab_returned(self)
            self._lender = None
        elif getattr(self, "_model", None) is not None:
            llama_cpp.llama_model_free(self._model)
        self._model = None

    def __del__(self) -> None:
        self.close()

    def _meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else ""

    # --- tokens -------------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        data = check_text(text, "the text to tokenize").encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        with self._vocab() as vocab:
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
            if n < 0:  # buffer too small: -n is the size needed
                cap = -n
                buf = (llama_cpp.llama_token * cap)()
                n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        return np.frombuffer(buf, dtype=np.int32, count=n).tolist()  # faster than list(buf[:n]), which holds the GIL longer (docs/measurements/code-notes.md)

    def piece(self, token: int, special: bool = False) -> bytes:
        if self._lean is not None:
            return self._lean.piece(token, special)
        return _piece(self._vocab_handle, token, special)

    def decode(self, tokens: Iterable[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_end(self, token: int) -> bool:
        """End of generation (EOS, EOT, <|im_end|>, ...)."""
        if self._lean is not None:
            return token in self._lean.ends
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab_handle, token))

    def end_ids(self) -> list[int]:
        """Every token that ends generation (`is_end`), in id order."""
        if self._lean is not None:
            return sorted(self._lean.ends)
        return [t for t in range(self.n_vocab) if self.is_end(t)]

    def fingerprint(self, n_tokens: int | None = None) -> str:
        """A hash of the bytes of tokens 0..n_tokens-1 (default: all): equal ⇔ the same tokens."""
        n_tokens = self.n_vocab if n_tokens is None else n_tokens
        h = hashlib.sha256(str(n_tokens).encode())
        with self._vocab() as vocab:
            for t in range(n_tokens):
                h.update(_text(vocab, t) + b"\0")
        return h.hexdigest()

    def text(self, token: int) -> bytes:
        """The token's own text in the vocabulary (special tokens included, padding too)."""
        with self._vocab() as vocab:
            return _text(vocab, token)

    def attr(self, token: int) -> int:
        """llama.cpp's attribute bits of a token (LLAMA_TOKEN_ATTR_NORMAL, _BYTE, _CONTROL, _UNUSED, …)."""
        with self._vocab() as vocab:
            return int(llama_cpp.llama_vocab_get_attr(vocab, token))

    def is_padding(self, token: int) -> bool:
        """A slot with no token behind it: llama.cpp's converters pad vocabularies with UNUSED `[PAD…]` entries."""
        with self._vocab() as vocab:
            attr = llama_cpp.llama_vocab_get_attr(vocab, token)
            return bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_UNUSED) or re.fullmatch(rb"\[PAD\d+\]", _text(vocab, token)) is not None

    def special_ids(self) -> dict[str, int | bool]:
        with self._vocab() as v:
            return {"bos": self.bos_id, "eos": self.eos_id, "eot": llama_cpp.llama_vocab_eot(v), "add_bos": self.add_bos,
                    "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)), "type": llama_cpp.llama_vocab_type(v)}

    # --- chat ---------------------------------------------------------------------------------
    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True, think: bool | None = None) -> str:
        """The chat template applied to `messages` (see chat_template.py); think: Qwen3's thinking switch."""
        if not self.chat_template:
            raise OndeviceError(f"{self.path.name} has no chat template; use `ondevice generate --raw` with a plain prompt.")
        return template_process.render(  # in a child process, under a time, memory and output budget
            self.chat_template, messages, model=self.path.name, add_generation_prompt=add_generation_prompt, think=think,
            bos_token=self.piece(self.bos_id, special=True).decode("utf-8", "replace") if self.bos_id >= 0 else "",
            eos_token=self.piece(self.eos_id, special=True).decode("utf-8", "replace") if self.eos_id >= 0 else "",
        )

    def encode_chat(self, messages: list[dict[str, str]], think: bool | None = None) -> list[int]:
        """`messages` through the chat template, as token ids (the template writes its own specials)."""
        return self.encode(self.render_chat(messages, think=think), add_special=False, parse_special=True)

    def encode_user(self, text: str) -> list[int]:
        """One user message through the chat template, as token ids."""
        return self.encode_chat([{"role": "user", "content": text}])

    @property
    def can_switch_thinking(self) -> bool:
        return bool(self.chat_template) and chat_template.has_thinking_switch(self.chat_template)


def _piece(vocab, token: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]


def _text(vocab, token: int) -> bytes:
    return llama_cpp.llama_vocab_get_text(vocab, token) or b""


class _Pieces:
    """What decoding reads of a vocabulary, kept after the vocabulary is let go: every token's bytes in
    one buffer (~1 MB for 152k tokens, where llama.cpp's vocabulary holds ~40), the bytes with special
    tokens rendered where they differ (llama.cpp renders a control token as nothing unless asked), and
    the end tokens."""

    def __init__(self, blob: bytes, bounds: np.ndarray, special: dict[int, bytes], ends: frozenset[int]):
        self.blob, self.bounds, self.special, self.ends = blob, bounds, special, ends  # token t: blob[bounds[t]:bounds[t + 1]]

    @classmethod
    def read(cls, tokenizer: "Tokenizer") -> "_Pieces":
        vocab, n = tokenizer._vocab_handle, tokenizer.n_vocab
        blob, bounds, special = bytearray(), np.zeros(n + 1, np.int64), {}
        buf = ctypes.create_string_buffer(256)
        for t in range(n):  # one buffer for all: no object a token left behind in the heap
            size = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, False)
            piece = buf.raw[:size] if size >= 0 else _piece(vocab, t, False)
            blob += piece
            bounds[t + 1] = len(blob)
            if not piece and (rendered := _piece(vocab, t, True)):
                special[t] = rendered
        ends = frozenset(t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t))
        return cls(bytes(blob), bounds, special, ends)

    def piece(self, token: int, special: bool) -> bytes:
        if special and token in self.special:
            return self.special[token]
        if not 0 <= token < len(self.bounds) - 1:
            return b""  # as llama.cpp answers an id it does not hold
        return self.blob[self.bounds[token]: self.bounds[token + 1]]


class StreamDecoder:
    """Turns a stream of token ids into text, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tokens: Iterable[int]) -> str:
        return "".join(self._utf8.decode(self._tokenizer.piece(t)) for t in tokens)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def vocab_mismatch(target: Tokenizer, drafter: Tokenizer) -> str | None:
    """Why the drafter cannot draft for the target (None: it can), as llama.cpp judges a draft model:
    the same tokenizer type and special tokens, the same text for every id both have, and where one
    vocabulary is longer, only padding beyond the other (Qwen2.5 7B+ list 152,064 ids, the 0.5B
    151,936: the same tokenizer). The drafter never proposes an id the target lacks (LlamaDrafter
    masks them), and stops drafting if the target commits an id the drafter lacks."""
    if target.special_ids() != drafter.special_ids():
        theirs, ours = drafter.special_ids(), target.special_ids()
        differ = ", ".join(k for k in ours if ours[k] != theirs[k])
        return f"their special tokens differ ({differ})"
    shared = min(target.n_vocab, drafter.n_vocab)
    if target.fingerprint(shared) != drafter.fingerprint(shared):
        return "their tokens differ"
    longer = target if target.n_vocab > drafter.n_vocab else drafter
    extra = [t for t in range(shared, longer.n_vocab) if not longer.is_padding(t)]
    if extra:
        return f"{longer.path.name} has {len(extra)} real tokens beyond id {shared}"
    return None


def check_same_vocab(target: Tokenizer, drafter: Tokenizer) -> None:
    """An OndeviceError (one line) unless the drafter's vocabulary works for the target (vocab_mismatch)."""
    reason = vocab_mismatch(target, drafter)
    if reason is not None:
        raise OndeviceError(
            f"the drafter {drafter.path.name} and the target {target.path.name} use different tokenizers "
            f"({drafter.n_vocab} vs {target.n_vocab} ids; {reason}); pick a drafter of the same model family."
        )
