"""The requests, as OpenAI's API spells them, checked into what the pipeline needs.

Unknown fields are ignored (clients send many: `user`, `store`, `metadata`…); known ones must have
their JSON type (`"max_tokens": "5"` or `true` is a 400, not 5 or 1). A body JSON parses but that is
no text is a 400 too: a string anywhere in it holding a lone surrogate (`"\ud800"`), an integer of
more than 4,300 digits (Python's limit on turning digits into an int). Fields that would change
the answer in a way ondevice cannot honour (`n` > 1, penalties, logprobs, tools, JSON mode) are refused
with a 400 rather than silently ignored. Fields a request leaves out take the server's defaults
(`ondevice serve --temperature … --max-tokens …`).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ondevice.serve.errors import ApiError
from ondevice.decode.verify import MAX_SEED, BadSampling, Sampling

MAX_STOPS = 4  # as OpenAI
MAX_STOP_CHARS = 1024  # one stop sequence (StopMatcher's work grows with its length)
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads pairs a valid \ud83d\ude00; one left alone is not text
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Types as JSON has them: "5" or true is not a number, [true] is not a list of token ids (pydantic's
# default would convert them); a JSON integer is still a number where a float is expected.
STRICT = ConfigDict(extra="ignore", strict=True)


@dataclass(frozen=True)
class Defaults:
    """What a request gets for a field it leaves out (the `ondevice serve` options)."""

    max_tokens: int = 1024
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: a fresh random seed per request


class ContentPart(BaseModel):
    model_config = STRICT
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def as_template_message(self) -> dict[str, str]:
        """{"role", "content"} with text parts joined; `developer` is OpenAI's new name for `system`."""
        if isinstance(self.content, list):
            if any(part.type != "text" for part in self.content):
                raise ApiError(400, "only text content parts are supported (no images or audio).", param="messages")
            text = "".join(part.text or "" for part in self.content)
        else:
            text = self.content or ""
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The fields /v1/chat/completions and /v1/completions share."""

    model_config = STRICT
    model: str = "default"
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # not OpenAI's: sent as extra body, as llama-server and vLLM take it
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0

    def refuse_unsupported(self) -> None:
        if (self.n or 1) != 1:
            raise ApiError(400, "n must be 1: ondevice answers with one choice per request.", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported (it would change the target's answer); leave it at 0.", param=name)

    def sampling(self, defaults: Defaults) -> Sampling:
        temperature = _or(self.temperature, defaults.temperature)
        if not 0 <= temperature <= 2:
            raise ApiError(400, f"temperature must be between 0 and 2 (got {temperature:.6g}).", param="temperature")
        seed = _or(self.seed, defaults.seed)
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise ApiError(400, f"seed must be between 0 and {MAX_SEED}; leave it out for a fresh one.", param="seed")
        try:
            return Sampling(temperature, _or(self.top_p, defaults.top_p), _or(self.top_k, defaults.top_k),
                            random.randrange(2**31) if seed is None else seed)
        except BadSampling as err:
            raise ApiError(400, str(err), param=err.param) from None

    def max_new_tokens(self, defaults: Defaults, n_ctx: int) -> int:
        value = _or(self.requested_max_tokens(), defaults.max_tokens)
        if not 1 <= value <= n_ctx:
            raise ApiError(400, f"max_tokens must be between 1 and the context size {n_ctx} (got {value}).", param="max_tokens")
        return value

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        stops = [s for s in stops if s]
        if len(stops) > MAX_STOPS:
            raise ApiError(400, f"at most {MAX_STOPS} stop sequences (got {len(stops)}).", param="stop")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ApiError(400, f"a stop sequence may be at most {MAX_STOP_CHARS} characters long.", param="stop")
        return stops


class ChatRequest(GenerationRequest):
    messages: list[Message]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool | None = None
    tools: list[dict] | None = None
    response_format: dict | None = None
    chat_template_kwargs: dict | None = None  # as vLLM: {"enable_thinking": false} turns Qwen3's thinking off

    def think(self) -> bool | None:
        value = (self.chat_template_kwargs or {}).get("enable_thinking")
        if value is not None and not isinstance(value, bool):
            raise ApiError(400, "chat_template_kwargs.enable_thinking must be true or false.", param="chat_template_kwargs")
        return value

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if not self.messages:
            raise ApiError(400, "messages must hold at least one message.", param="messages")
        if self.logprobs:
            raise ApiError(400, "logprobs are not supported.", param="logprobs")
        if self.tools:
            raise ApiError(400, "tool calls are not supported; send plain messages.", param="tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ApiError(400, "only response_format {\"type\": \"text\"} is supported.", param="response_format")

    def requested_max_tokens(self) -> int | None:
        return _or(self.max_completion_tokens, self.max_tokens)


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for name, unsupported in (("echo", self.echo), ("suffix", self.suffix), ("logprobs", self.logprobs is not None),
                                  ("best_of", (self.best_of or 1) != 1)):
            if unsupported:
                raise ApiError(400, f"{name} is not supported.", param=name)

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text or token ids (a batch of several is refused)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, f"one prompt per request (got {len(prompt)}).", param="prompt")
            prompt = prompt[0]
        if not prompt:
            raise ApiError(400, "the prompt is empty.", param="prompt")
        return prompt


def _or(value, default):
    return default if value is None else value


def parse(kind: type[GenerationRequest], body: bytes) -> GenerationRequest:
    """The request in `body`, or a 400 naming what is wrong with its JSON or its types
    (then the caller checks the model, then `refuse_unsupported`)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON ({err}).") from None
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects too deeply.") from None
    except ValueError:  # int("9" * 5000): past sys.get_int_max_str_digits()
        raise ApiError(400, "a number in the request body has more digits than any field takes (4,300 at most).") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object.")
    found = _lone_surrogate(body, data)
    if found is not None:
        where, field = found
        raise ApiError(400, f"{where[:80]} holds a lone surrogate (a \\uD800-\\uDFFF escape without its pair), which is not text; "
                            "send valid Unicode.", param=field[:80] if field else None)
    try:
        request = kind.model_validate(data)
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects too deeply.") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ApiError(400, f"{where}: {first['msg']}.", param=str(first["loc"][0]) if first["loc"] else None) from None
    return request



def _lone_surrogate(body: bytes, data: dict) -> tuple[str, str | None] | None:
    """(where, the field) if a string or a key in the parsed body holds a lone surrogate, e.g. ("messages",
    "messages"); None if none does. Only a `\\uD800`-`\\uDFFF` escape makes one (raw UTF-8 cannot), so a
    body without such an escape is not walked; one with it is walked without recursion (it may nest as
    deep as json.loads allowed)."""
    if not _SURROGATE_ESCAPE.search(body):
        return None
    for key, value in data.items():
        if _SURROGATE.search(key):
            return "a key of the body", None
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    return key, key
            elif isinstance(item, dict):
                if any(_SURROGATE.search(k) for k in item):
                    return f"a key in {key}", key
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None
