"""A model's chat template (Jinja, from its GGUF) rendered the way transformers renders it.

The environment is transformers' (`apply_chat_template`): a sandbox with trim_blocks/lstrip_blocks,
the loopcontrols extension, a `tojson` that keeps non-ASCII text, `raise_exception` and
`strftime_now`. Qwen3's template reads `enable_thinking` (`think=False` adds an empty think block so
the model answers at once); templates that do not read it ignore it. A template that fails to render
is one OndeviceError line of at most MAX_MESSAGE_CHARS of the template's own words, never a
traceback, whatever it raised (an unknown codec is a LookupError). Tokenizers render in a child
process under a time, memory and output budget (template_process.py): a template comes from the
model file, from anyone.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox

from ondevice.errors import OndeviceError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MAX_MESSAGE_CHARS = 300  # of what a template says when it fails (raise_exception('E' * 10**7) printed 10 MB)


class TemplateFailed(OndeviceError):
    """The chat template raised or could not be parsed."""


def _raise_exception(message: str):
    raise TemplateFailed(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def has_thinking_switch(template: str) -> bool:
    """Whether the template reads `enable_thinking` (Qwen3 and its kin)."""
    return "enable_thinking" in template


def render(
    template: str, messages: list[dict[str, str]], *, model: str, add_generation_prompt: bool = True,
    bos_token: str = "", eos_token: str = "", think: bool | None = None,
) -> str:
    """The prompt text for `messages`; think None leaves the template's default (Qwen3: thinking on)."""
    options = {} if think is None else {"enable_thinking": think}
    try:
        compiled = _environment().from_string(template)
        return compiled.render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token, **options
        )
    except TemplateFailed as err:
        raise OndeviceError(f"the chat template of {model} refused the conversation: {_bounded(str(err))}") from None
    except (TimeoutError, MemoryError):  # the worker's budgets (template_process.py) say these
        raise
    except Exception as err:  # noqa: BLE001 - whatever a template makes Python raise is the template's failure
        where = f" (line {err.lineno})" if getattr(err, "lineno", None) else ""
        first = str(err).splitlines()[0] if str(err).strip() else ""
        raise OndeviceError(
            f"the chat template of {model} failed to render{where}: {type(err).__name__}: {_bounded(first)}; "
            "use `ondevice generate --raw` to send a prompt without it"
        ) from None


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else f"{text[:MAX_MESSAGE_CHARS]}… ({len(text) - MAX_MESSAGE_CHARS:,} more characters)"
