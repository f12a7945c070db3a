"""Text from files, models and users, printed as it is: never parsed as Rich markup, one line, bounded.

A metadata key, a model name, a path or a chat template's error can hold `[/x]` (Rich's markup
parser raised MarkupError and the CLI's error printer crashed) or `[bold]` (silently eaten), bytes
that are not UTF-8 (file names and arguments arrive with them as surrogates, which a terminal stream
refuses to encode), control characters that move the cursor or end the line, and megabytes of text
(a template's `raise_exception('E' * 10**7)`). `plain(text)` makes any of it one printable line of
at most MAX_CHARS characters; `literal(text, style)` is that line as a Rich Text, which Rich prints
without looking for markup.
"""

from __future__ import annotations

import re

from rich.console import Console
from rich.text import Text

MAX_CHARS = 2000  # an error line longer than this says how much more there was
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def plain(text: object, max_chars: int = MAX_CHARS) -> str:
    """`text` as one printable line: invalid UTF-8 and lone surrogates as U+FFFD, control characters
    escaped (a newline as \\n), cut at max_chars with the count of what was left out."""
    text = str(text)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}… ({len(text) - max_chars:,} more characters)"
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")  # bytes of a file name or an argument
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")  # lone surrogates from elsewhere
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], text)


def literal(text: object, style: str | None = None) -> Text:
    return Text(plain(text), style=style or "")


def say(console: Console, text: object, style: str | None = None) -> None:
    """One line of `text` on `console`, printed as it is."""
    console.print(literal(text, style), highlight=False, soft_wrap=True)


def error_line(message: object) -> Text:
    """`error: MESSAGE`, the label in red, the message as it is."""
    return Text.assemble(("error:", "bold red"), " ", literal(message))
