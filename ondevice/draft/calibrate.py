"""SourceRecord: how often each free source's proposals came true, measured online, so a hybrid tree
prices a free node by its source's record instead of by the source's own guess.

A free source scores its steps with a guess (suffix: a share of past occurrences; recycling: the
target's probability after the same token in another context; lookup: a fixed level rate). The
hybrid search (draft/hybrid.py) ranks free and model nodes by one score, so a guess that runs high
(recycling's "0.97" after a token whose next token depends on far more than that token) displaces
the drafter's better nodes and, above COVER_P, stops the drafter from expanding its parent at all.

Each round the router shows the sources' proposals here (`propose`); the next round's context holds
the tokens the target emitted (accepted drafts + its own token), against which they are judged
(`observe`): a proposed node whose parent's path was emitted is judged right or wrong by the token
emitted at its depth. That is exactly the step probability a best-first search multiplies:
P(node right | its parent right). Counts are kept per source and per bin of stated probability.
The price of a step is its bin's rate shrunk by PRIOR pseudo-observations toward the stated
probability scaled by the source's overall record (right guesses / the stated probabilities of
all its judged guesses, itself shrunk toward 1): a bin seen rarely borrows from the source's other
bins, so a source that is seldom right (recycling on a short chat: docs/measurements/code-notes.md)
is priced low at every confidence after a few rounds, and a new session trusts the guesses.

Prices only rank nodes: greedy and SpecExec verification accept what the target chooses whatever
the tree, so exactness does not depend on them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ondevice.decode.tree import DraftTree

BINS = 10  # stated step probabilities in [0, .1), [.1, .2), … [.9, 1]
PRIOR = 4.0  # pseudo-observations at the stated probability each bin starts with
TAIL = 8  # context tokens compared to tell "the next round of this answer" from another context


class SourceRecord:
    """Per source and bin of stated step probability: [judged, right] counts."""

    def __init__(self, bins: int = BINS, prior: float = PRIOR):
        self.bins, self.prior = bins, prior
        self.counts: dict[str, np.ndarray] = {}  # source -> (bins, 2)
        self.stated: dict[str, float] = {}  # source -> Σ stated probability of its judged guesses
        self.pending: tuple[int, tuple[int, ...], dict[str, DraftTree]] | None = None  # (context length, its tail, proposals)

    def forget(self) -> None:
        self.counts, self.stated, self.pending = {}, {}, None

    def bin(self, step: float) -> int:
        return min(self.bins - 1, int(math.exp(step) * self.bins))

    def rate(self, source: str, step: float) -> float:
        """The price of a step the source stated as log-prob `step`: its bin's record, shrunk toward
        exp(step) × the source's overall ratio of right guesses to stated probability."""
        counts = self.counts.get(source, np.zeros((self.bins, 2)))
        scale = (counts[:, 1].sum() + self.prior) / (self.stated.get(source, 0.0) + self.prior)
        judged, right = counts[self.bin(step)]
        return (right + self.prior * min(1.0, math.exp(step) * scale)) / (judged + self.prior)

    def price(self, source: str, tree: DraftTree) -> DraftTree:
        """`tree` with every step re-scored by `rate` (cumulative log-probs, a child never above its parent)."""
        logprobs = np.zeros(len(tree))
        for i in range(1, len(tree)):
            parent = int(tree.parents[i])
            step = float(tree.logprobs[i] - tree.logprobs[parent])
            logprobs[i] = logprobs[parent] + math.log(min(max(self.rate(source, step), 1e-6), 1.0 - 1e-6))
        return DraftTree(tree.tokens, tree.parents, logprobs)

    def propose(self, context: Sequence[int], trees: dict[str, DraftTree]) -> None:
        """This round's proposals, to be judged against what follows `context`."""
        self.pending = (len(context), tuple(int(t) for t in context[-TAIL:]), trees)

    def observe(self, context: Sequence[int]) -> None:
        """Judge the pending proposals if `context` goes on from theirs (else drop them)."""
        if self.pending is None:
            return
        n, tail, trees = self.pending
        self.pending = None
        if len(context) <= n or tuple(int(t) for t in context[n - len(tail) : n]) != tail:
            return
        emitted = [int(t) for t in context[n:]]
        for source, tree in trees.items():
            self.judge(source, tree, emitted)

    def judge(self, source: str, tree: DraftTree, emitted: list[int]) -> None:
        counts = self.counts.setdefault(source, np.zeros((self.bins, 2)))
        self.stated.setdefault(source, 0.0)
        on_path = [True] + [False] * (len(tree) - 1)
        depth = [0] * len(tree)
        for i in range(1, len(tree)):  # parents come before children
            parent = int(tree.parents[i])
            depth[i] = depth[parent] + 1
            if not on_path[parent] or depth[i] > len(emitted):
                continue
            on_path[i] = int(tree.tokens[i]) == emitted[depth[i] - 1]
            step = float(tree.logprobs[i] - tree.logprobs[parent])
            counts[self.bin(step)] += (1, on_path[i])
            self.stated[source] += math.exp(step)
