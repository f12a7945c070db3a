"""SuffixDrafter: a free drafter (no model) over a suffix automaton of this session's text.

SuffixDecoding (Oliaro et al. 2024), with a suffix automaton for its suffix tree. The index holds
the current context and what came before it in this session: earlier prompts and answers (a chat,
`serve` conversations, bench prompts), so an agent that re-emits code it wrote two turns ago, or a
prompt that repeats an earlier one, gets it proposed. Each round it proposes what followed the
longest suffix of the context that occurred before, as a tree weighted by how often each
continuation occurred (frequencies, as SuffixDecoding does), best nodes first.

**Incremental.** `draft(context)` appends only the tokens of `context` the index has not seen: a
context that goes on from the last one costs one `SuffixAutomaton.extend` per new token. A context
that parts from the last one inside what the last call appended, at most MAX_GUESS tokens back (a
guess of the overlap worker that did not come true, the tail of an answer the chat template
re-tokenised), is rolled back to where they part. One that parts earlier (another conversation)
becomes a new document, after a separator no context contains: the old one stays as history.

**Bounded memory.** Two automata overlap: the older indexes at most `history` tokens, the younger
the newest half of them; when the older is full it is dropped and the younger takes over (the
oldest text is evicted, half a history at a time, with no pause to rebuild). At most 1.5 × history
tokens are indexed, ≤ 2 states and 3 transitions each: ~10 MB for the default 16,384
(docs/measurements/code-notes.md, "The suffix drafter's memory"), plus the undo log of at most
MAX_GUESS tokens (~0.6 MB).

**Scores.** A continuation c of the matched suffix w (length ℓ) scores
log(count(wc) / (Σ_c' count(wc') + 1/ℓ)): its share of the occurrences, with 1/ℓ of an occurrence
held back for "something else" (a single occurrence after a 2-token match: 0.67; after 20
tokens: 0.95). Deeper levels go on with ℓ + depth. A guess that shapes the tree (and ranks it
against the model's nodes in hybrid trees); the target decides what is accepted.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Sequence

import numpy as np

from ondevice.draft.free_tree import for_rule
from ondevice.draft.suffix_automaton import SuffixAutomaton
from ondevice.errors import OndeviceError
from ondevice.decode.protocols import MAX_BUDGET, Drafter, DraftSpec
from ondevice.decode.tree import DraftTree, common_prefix

HISTORY_TOKENS = 16_384  # tokens the older automaton holds at most (see "Bounded memory")
MIN_MATCH = 2  # a shorter match proposes nothing (in a few thousand tokens every single token recurs)
SEPARATOR = -1  # between documents; never proposed
MAX_GUESS = MAX_BUDGET + 1  # the most tokens a context can take back (an overlap guess: one tree path + its root)


class SuffixIndex:
    """This session's text in two overlapping suffix automata; `doc` is the context last indexed."""

    def __init__(self, history: int = HISTORY_TOKENS):
        if history < 2:
            raise OndeviceError(f"the suffix history must hold at least 2 tokens, not {history}.")
        self.history = history
        self.older = SuffixAutomaton(MAX_GUESS)
        self.younger: SuffixAutomaton | None = None
        self.doc: list[int] = []  # the current document as indexed
        self.floor = 0  # doc positions below this cannot be rolled back (appended before the last call)

    @property
    def indexed_tokens(self) -> int:
        return len(self.older) + (len(self.younger) if self.younger is not None else 0)

    def sync(self, context: Sequence[int]) -> None:
        """Make `context` the current document, appending only what is new (see the module docstring)."""
        n = len(self.doc)
        cp = n if len(context) >= n and list(context[:n]) == self.doc else common_prefix(self.doc, context)  # usually it goes on
        if cp < len(self.doc):
            if cp >= self.floor and len(self.doc) - cp <= MAX_GUESS:
                self._rollback(len(self.doc) - cp)
            else:
                self.doc, cp = [], 0
                self._append(SEPARATOR)
        self.floor = len(self.doc)
        for automaton in self._automata():
            automaton.mark()
        for token in context[cp:]:
            self.doc.append(int(token))
            self._append(int(token))

    def _automata(self) -> list[SuffixAutomaton]:
        return [self.older] if self.younger is None else [self.older, self.younger]

    def _append(self, token: int) -> None:
        for automaton in self._automata():
            automaton.extend(token)
        if len(self.older) >= self.history:  # evict: the younger half takes over
            self.older, self.younger = self.younger or SuffixAutomaton(MAX_GUESS), None
        if self.younger is None and len(self.older) >= self.history // 2:
            self.younger = SuffixAutomaton(MAX_GUESS)
            self.floor = len(self.doc)  # what came before is not in the younger one
            for automaton in self._automata():
                automaton.mark()

    def _rollback(self, n: int) -> None:
        for automaton in self._automata():  # both were marked at `floor` or before
            automaton.rollback(n)
        del self.doc[len(self.doc) - n :]

    def match(self) -> tuple[int, int]:
        """(state, length) of the longest suffix of the text that occurred before, in the older automaton."""
        state = self.older.match_state()
        return state, self.older.length[state]


class SuffixDrafter(Drafter):
    """Drafter protocol with no model: continuations of the context's longest earlier match."""

    def __init__(self, n_vocab: int, history: int = HISTORY_TOKENS, min_match: int = MIN_MATCH):
        self.n_vocab = n_vocab
        self.min_match = min_match
        self.index = SuffixIndex(history)

    def forget(self) -> None:
        """Drop the session's history (a new session, or a benchmark row that must not see the last one's)."""
        self.index = SuffixIndex(self.index.history)

    def draft(self, context: Sequence[int], spec: DraftSpec) -> DraftTree:
        if len(context) == 0:
            raise OndeviceError("the suffix drafter needs a non-empty context.")
        if spec.budget < 0:
            raise OndeviceError(f"the draft budget must be >= 0, not {spec.budget}.")
        self.index.sync(context)
        tree = self.propose(int(context[-1]), spec.budget, spec.max_depth)
        return for_rule(tree, spec.sample_children, spec.temperature, self.n_vocab)

    def propose(self, root: int, budget: int, max_depth: int | None = None) -> DraftTree:
        """The `budget` best continuations of the indexed context's longest earlier match, as a tree."""
        state, length = self.index.match()
        if length < self.min_match or budget == 0:
            return DraftTree.root_only(root)
        sam = self.index.older
        tokens, parents, logprobs = [root], [-1], [0.0]
        heap: list[tuple[float, int, int, int, int, int]] = []  # (-score, tie, token, state, out parent, depth)
        tie = itertools.count()  # siblings stay in rank order on equal scores

        def push_children(state: int, out: int, depth: int) -> None:
            if max_depth is not None and depth >= max_depth:
                return
            kids = [(sam.count[s], t, s) for t, s in sam.next[state].items() if t != SEPARATOR]
            held_back = sum(c for c, _, _ in kids) + 1.0 / (length + depth)
            for count, token, child in heapq.nlargest(budget, kids):  # by count (ties: the larger token id)
                score = logprobs[out] + math.log(count / held_back)
                heapq.heappush(heap, (-score, next(tie), token, child, out, depth + 1))

        push_children(state, 0, 0)
        while heap and len(tokens) <= budget:
            neg_score, _, token, child, out_parent, depth = heapq.heappop(heap)
            tokens.append(token)
            parents.append(out_parent)
            logprobs.append(-neg_score)
            push_children(child, len(tokens) - 1, depth)
        return DraftTree(np.array(tokens), np.array(parents), np.array(logprobs))
