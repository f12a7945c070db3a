"""Telling a model's thinking from its answer as tokens stream: `<think> … </think>` blocks (Qwen3).

`ThinkSplitter.push(text)` returns runs of (text, is_thinking), holding back a tag cut across two
chunks, so the chat can show the thinking dimmed and the answer plain.
"""

from __future__ import annotations

from ondevice.prompt.chat_template import THINK_CLOSE, THINK_OPEN


class ThinkSplitter:
    def __init__(self) -> None:
        self.thinking = False
        self._held = ""

    def push(self, text: str) -> list[tuple[str, bool]]:
        runs, text = [], self._held + text
        while True:
            tag = THINK_CLOSE if self.thinking else THINK_OPEN
            at = text.find(tag)
            if at < 0:
                break
            if self.thinking:  # the closing tag belongs to the thinking run
                runs.append((text[: at + len(tag)], True))
            else:  # the opening tag starts the thinking run
                runs.append((text[:at], False))
                runs.append((tag, True))
            text, self.thinking = text[at + len(tag):], not self.thinking
        keep = _partial_tag_length(text, THINK_CLOSE if self.thinking else THINK_OPEN)
        self._held = text[len(text) - keep:] if keep else ""
        runs.append((text[: len(text) - keep], self.thinking))
        return [(run, thinking) for run, thinking in runs if run]

    def flush(self) -> list[tuple[str, bool]]:
        held, self._held = self._held, ""
        return [(held, self.thinking)] if held else []


def _partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag` (it may be completed next chunk)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
