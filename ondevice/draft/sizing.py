"""Sizing a free drafter's tree per round: verify only as many of its nodes as pay for their pass.

A free drafter's confidence changes from round to round far more than the drafter model's: after a
40-token match in the prompt (an edit copying a function) the next 16 tokens are almost surely the
copy's, after a 2-token match the next one is a coin toss. A fixed budget pays a big pass for the
coin tosses or a small one for the copy: where a pass grows with its tokens (a CPU in RAM:
docs/measurements/2026-11-27-sized-free-rounds.md) each loses what the other wins.

So each round the tree (best-first: its nodes in falling path score, every prefix a tree) is cut to
the prefix of n nodes that maximizes the expected tokens per second of the round:

    n* = argmax_n  (1 + Σ_{i ≤ n} P_i) / t(n + 1)

P_i: the probability that the target accepts the path to node i (exp of its path log-prob, the
source's scores re-priced by its record: draft/calibrate.py), so 1 + Σ P_i is the expected tokens
the pass emits (any tree: every node on the accepted path is one token, plus the target's own);
t(k): the target's pass over k tokens (the planner's rescaled curve, per-pass overhead included).
n* = 0 is a pass of the root alone: exactly the target alone's round. (SuffixDecoding sizes its
speculation by the match length for the same reason; here the cost curve decides.)

The rounds this picks are the ones whose P_i came out high, and a high estimate is more often too
high than a low one (the winner's curse): where a pass grows steeply with its tokens, rounds that
verify drafts on such estimates can make the target alone slower than it is without them
(docs/measurements/2026-12-05-sizing-record.md). `SizingRecord` closes the loop: it compares the
drafts the verified rounds were expected to accept with what the target accepted and scales the
P_i by that ratio (shrunk toward 1, fading, so a session that stops drafting comes back to trusting
its sources and tries again).

Cutting a tree never changes what is accepted from the kept part, so exactness is the tree's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ondevice.decode.tree import DraftTree


PRIOR_DRAFTS = 2.0  # expected drafts, accepted as expected, each builder's record starts with
FADE = 0.99  # per sized round (most draft nothing): a round weighs 37% a hundred rounds later


class SizingRecord:
    """Per builder: the drafts its sized rounds were expected to accept (Σ P_i over the nodes
    verified) and the drafts the target accepted, fading with every sized round."""

    def __init__(self):
        self.expected: dict[str, float] = {}
        self.accepted: dict[str, float] = {}
        self.pending: tuple[str, float] | None = None  # the last sized tree's (builder, expected drafts)

    def scale(self, builder: str) -> float:
        """Accepted ÷ expected drafts of this builder's verified rounds, shrunk toward 1."""
        return (self.accepted.get(builder, 0.0) + PRIOR_DRAFTS) / (self.expected.get(builder, 0.0) + PRIOR_DRAFTS)

    def sized(self, builder: str, expected_drafts: float) -> None:
        """A round of `builder` was sized; it verifies nodes expected to accept `expected_drafts` (0: none)."""
        self.expected[builder] = self.expected.get(builder, 0.0) * FADE
        self.accepted[builder] = self.accepted.get(builder, 0.0) * FADE
        self.pending = (builder, expected_drafts) if expected_drafts > 0 else None

    def verified(self, accepted_drafts: int) -> None:
        """The target accepted `accepted_drafts` of the last sized tree's nodes."""
        if self.pending is not None:
            builder, expected = self.pending
            self.expected[builder] += expected
            self.accepted[builder] += accepted_drafts
            self.pending = None


def expected_drafts(path_logprobs: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """[0, E_1, E_2, …]: the drafts a pass over the first n nodes is expected to accept, each
    node's P_i scaled by `scale` (at most 1)."""
    return np.concatenate(([0.0], np.cumsum(np.minimum(1.0, scale * np.exp(path_logprobs)))))


def best_size(path_logprobs: np.ndarray, pass_seconds: Sequence[float], scale: float = 1.0) -> int:
    """n*: how many of the nodes (path log-probs in best-first order, root excluded) to verify, given
    pass_seconds[k] = seconds of a pass over k + 1 tokens (k = 0: the root alone), each P_i scaled
    by `scale` (a SizingRecord's)."""
    n_max = min(len(path_logprobs), len(pass_seconds) - 1)
    if n_max <= 0:
        return 0
    expected = 1.0 + expected_drafts(path_logprobs[:n_max], scale)
    rate = expected / np.asarray(pass_seconds[: n_max + 1], dtype=np.float64)
    return int(np.argmax(rate))  # ties: the smaller tree


def cut(tree: DraftTree, n: int) -> DraftTree:
    """The first n nodes of a best-first tree, with its root (a tree: parents come first)."""
    keep = n + 1
    return DraftTree(tree.tokens[:keep], tree.parents[:keep], tree.logprobs[:keep])


def sized(tree: DraftTree, pass_seconds: Sequence[float], scale: float = 1.0) -> DraftTree:
    """`tree` (best-first, ancestor-closed prefixes) cut to the size that pays best for its pass."""
    return cut(tree, best_size(np.asarray(tree.logprobs[1:], dtype=np.float64), pass_seconds, scale))
