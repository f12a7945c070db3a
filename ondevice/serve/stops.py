"""Stop sequences on streamed text: cut at the first one, never show a piece of one.

Text arrives in pieces (one per target pass), and a stop sequence may straddle two pieces, so the
end of the text that could still grow into a stop sequence is held back until later pieces decide.
A complete match is final only if no stop sequence that starts earlier is still unfinished.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.stopped = False  # a stop sequence was found: the answer ends before it
        self._held = ""

    def push(self, text: str) -> str:
        """The part of the text so far that is safe to show."""
        if self.stopped:
            return ""
        text = self._held + text
        match, unfinished = self._first_match(text), self._first_unfinished(text)
        if match is not None and match <= unfinished:
            self.stopped, self._held = True, ""
            return text[:match]
        self._held = text[unfinished:]
        return text[:unfinished]

    def flush(self) -> str:
        """At the end of the answer: what was held back, cut at a stop sequence it holds."""
        text, self._held = ("" if self.stopped else self._held), ""
        match = self._first_match(text)
        if match is not None:
            self.stopped = True
            return text[:match]
        return text

    def _first_match(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _first_unfinished(self, text: str) -> int:
        """Where the earliest stop sequence that the end of `text` begins (but does not finish) starts;
        len(text) if none."""
        longest = max((len(s) for s in self.stops), default=1)
        for start in range(max(0, len(text) - longest + 1), len(text)):
            tail = text[start:]
            if any(len(tail) < len(s) and s.startswith(tail) for s in self.stops):
                return start
        return len(text)
