"""SuffixAutomaton: every substring of a growing token text, with how often it occurs, built online.

A suffix automaton (Blumer et al. 1985) is the smallest automaton that accepts every suffix of a
text. Its states are the classes of substrings that end at the same set of positions (endpos);
reading a substring from state 0 lands on its class. Per state: `length` (its longest member),
`link` (the class of the longest suffix outside it), `next` (token → state) and `count` =
|endpos|, how many times its members occur. For the drafting it serves (draft/suffix_drafter.py):

- `match_state()`: the class of the longest suffix of the text that also occurred earlier —
  `link` of the whole text's state — so its transitions are what followed that suffix before;
- count(next[s][c]) is how often the suffix was followed by c (SuffixDecoding's frequencies).

`extend(token)` appends one token: amortised O(1) transitions (at most 2n states and 3n
transitions for n tokens), plus one +1 per state on the new text's suffix-link chain (every
suffix of the text occurs once more). That chain is short in ordinary text; a long run of one
token makes it as long as the run, so at most CHAIN_CAP states are counted and the counts of
shorter suffixes inside such a run lag (they only weight proposals).

`mark()` starts an undo log and `rollback(n)` removes the last n tokens appended since then
(in reverse: counts, redirected transitions, clone, new transitions, states), so a context that
was a guess (overlap drafting) can be taken back exactly. The log keeps the last `undo_limit`
steps (a step holds a few small lists: ~300 B).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

CHAIN_CAP = 256  # states counted per appended token (see the module docstring)


@dataclass
class _Step:
    """What one `extend` changed, to undo it."""

    token: int
    last: int  # `last` before the step
    cur: int  # the state made for the whole text
    added: list[int] = field(default_factory=list)  # states p given next[p][token] = cur
    clone: int = -1  # the clone made (-1: none), of state `cloned`
    cloned: int = -1
    redirected: list[int] = field(default_factory=list)  # states p whose next[p][token] went cloned -> clone


class SuffixAutomaton:
    def __init__(self, undo_limit: int | None = None) -> None:
        """undo_limit: `rollback` reaches at most this many tokens back (older undo entries are dropped)."""
        self.length: list[int] = [0]  # state -> its longest member's length
        self.link: list[int] = [-1]  # state -> suffix link (state 0, the empty string, has none)
        self.next: list[dict[int, int]] = [{}]  # state -> token -> state
        self.count: list[int] = [0]  # state -> |endpos| (state 0: not kept)
        self.last = 0  # the state of the whole text
        self.n_tokens = 0
        self.undo_limit = undo_limit
        self._undo: deque[_Step] | None = None  # since `mark()`, one entry per appended token (the last undo_limit)

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def n_states(self) -> int:
        return len(self.length)

    def _new_state(self, length: int, link: int, nxt: dict[int, int], count: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.next.append(nxt)
        self.count.append(count)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
        """Append one token to the text."""
        step = _Step(token, self.last, self._new_state(self.length[self.last] + 1, -1, {}, 0))
        cur, p = step.cur, self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            step.added.append(p)
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # q holds longer strings that are not suffixes: split off the ones that are
                clone = self._new_state(self.length[p] + 1, self.link[q], dict(self.next[q]), self.count[q])
                step.clone, step.cloned = clone, q
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    step.redirected.append(p)
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur
        self.n_tokens += 1
        self._add_occurrence(cur, +1)
        if self._undo is not None:
            self._undo.append(step)

    def _add_occurrence(self, state: int, delta: int) -> None:
        """count += delta on the suffix-link chain from `state` (every suffix of the text), CHAIN_CAP states at most."""
        for _ in range(CHAIN_CAP):
            if state <= 0:
                return
            self.count[state] += delta
            state = self.link[state]

    # --- undo ---------------------------------------------------------------------------------
    def mark(self) -> None:
        """From now on `rollback` can take back what is appended (the undo log restarts here)."""
        self._undo = deque(maxlen=self.undo_limit)

    def can_rollback(self) -> int:
        """How many of the last appended tokens `rollback` can remove."""
        return len(self._undo) if self._undo is not None else 0

    def rollback(self, n: int) -> None:
        """Remove the last n appended tokens (n <= can_rollback())."""
        if n > self.can_rollback():
            raise ValueError(f"can roll back {self.can_rollback()} tokens, not {n}")
        for _ in range(n):
            step = self._undo.pop()
            self._add_occurrence(step.cur, -1)
            token = step.token
            if step.clone >= 0:
                for p in step.redirected:
                    self.next[p][token] = step.cloned
                self.link[step.cloned] = self.link[step.clone]
            for p in step.added:
                del self.next[p][token]
            del self.length[step.cur :], self.link[step.cur :], self.next[step.cur :], self.count[step.cur :]
            self.last = step.last
            self.n_tokens -= 1

    # --- queries ------------------------------------------------------------------------------
    def match_state(self) -> int:
        """The state of the longest suffix of the text that also ends earlier (0: none does)."""
        return max(self.link[self.last], 0)

    def walk(self, tokens) -> int:
        """The state of `tokens` read from the start (-1: not a substring of the text)."""
        state = 0
        for token in tokens:
            state = self.next[state].get(token, -1)
            if state < 0:
                return -1
        return state
