"""OpenAI's response objects for chat and text completions, whole or as server-sent-event chunks.

Besides OpenAI's `usage` (with `prompt_tokens_details.cached_tokens`: prompt tokens the cache already
held), every finished answer carries an `ondevice` object: target passes, tokens per pass, tok/s,
the time split, the tree and the planner's plan, and how long the request waited in the queue.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ondevice.serve.generation import Completion


@dataclass
class Envelope:
    """What every object of one response repeats: id, creation time, model."""

    kind: str  # "chat.completion" or "text_completion"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat.completion" else "cmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex[:24]}"

    @property
    def chat(self) -> bool:
        return self.kind == "chat.completion"

    def _object(self, kind: str, choices: list, **extra) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices, **extra}

    def whole(self, done: Completion) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": done.text}, "logprobs": None, "finish_reason": done.finish_reason}
        else:
            choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": done.finish_reason}
        return self._object(self.kind, [choice], usage=usage(done), ondevice=done.ondevice)

    def chunk(self, text: str | None = None, finish: Completion | None = None, first: bool = False) -> dict:
        """A streamed piece: text, or (with `finish`) the empty last piece that says why it ended."""
        reason = finish.finish_reason if finish else None
        if self.chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
            kind = "text_completion"
        return self._object(kind, [choice], **({"ondevice": finish.ondevice} if finish else {}))

    def usage_chunk(self, done: Completion) -> dict:
        """`stream_options.include_usage`: one more chunk, with no choices, carrying the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._object(kind, [], usage=usage(done))


def usage(done: Completion) -> dict:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


def sse(data: dict | str) -> bytes:
    """One server-sent event; the stream ends with `data: [DONE]`."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
