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

Cutting a tree never changes what is accepted from the kept part, so exactness is the tree's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ondevice.decode.tree import DraftTree


def best_size(path_logprobs: np.ndarray, pass_seconds: Sequence[float]) -> int:
    """n*: how many of the nodes (path log-probs in best-first order, root excluded) to verify, given
    pass_seconds[k] = seconds of a pass over k + 1 tokens (k = 0: the root alone)."""
    n_max = min(len(path_logprobs), len(pass_seconds) - 1)
    if n_max <= 0:
        return 0
    expected = 1.0 + np.concatenate(([0.0], np.cumsum(np.exp(path_logprobs[:n_max]))))
    rate = expected / np.asarray(pass_seconds[: n_max + 1], dtype=np.float64)
    return int(np.argmax(rate))  # ties: the smaller tree


def cut(tree: DraftTree, n: int) -> DraftTree:
    """The first n nodes of a best-first tree, with its root (a tree: parents come first)."""
    keep = n + 1
    return DraftTree(tree.tokens[:keep], tree.parents[:keep], tree.logprobs[:keep])


def sized(tree: DraftTree, pass_seconds: Sequence[float]) -> DraftTree:
    """`tree` (best-first, ancestor-closed prefixes) cut to the size that pays best for its pass."""
    return cut(tree, best_size(np.asarray(tree.logprobs[1:], dtype=np.float64), pass_seconds))
