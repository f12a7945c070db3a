"""How much a target's logits depend on batch size ("batch noise"), and the margins it threatens.

Verifying n drafted tokens in one pass runs other kernels than decoding them one at a time, so the
logits differ slightly. Greedy decoding stays exact as long as that difference never flips an
argmax, i.e. wherever the target's top-1/top-2 margin exceeds the noise. `measure_batch_noise`
measures the noise of any `ondevice.protocols.Target`; tests and benchmarks compare divergences
against it (DESIGN.md, "Exactness and numerics").
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ondevice.protocols import Target
from ondevice.tree import DraftTree


def top2_margin(logits_row: np.ndarray) -> float:
    """Top-1 minus top-2 logit of one (vocab,) row: how far greedy decoding is from a tie."""
    top2 = np.partition(np.asarray(logits_row, dtype=np.float64), -2)[-2:]
    return float(top2[1] - top2[0])


def greedy_reference(
    target: Target, prompt: Sequence[int], max_new: int, is_end: Callable[[int], bool] | None = None
) -> list[int]:
    """The target alone, greedy, one token per pass: max_new tokens, or fewer ending with the first
    end token when `is_end` is given. The cache ends holding prompt + output[:-1]."""
    target.truncate(0)
    target.prefill(prompt[:-1])
    root, out = prompt[-1], []
    while len(out) < max_new and not (out and is_end is not None and is_end(root)):
        logits = target.forward_tree(DraftTree.root_only(root))[0]  # the prediction after `root`
        target.commit([0])
        root = int(np.argmax(logits))
        out.append(root)
    return out


def logits_one_by_one(target: Target, tokens: Sequence[int]) -> np.ndarray:
    """(n, vocab) logits of tokens fed as n one-node trees, each committed before the next."""
    rows = []
    for token in tokens:
        rows.append(target.forward_tree(DraftTree.root_only(int(token)))[0])
        target.commit([0])
    return np.stack(rows)


def logits_as_chain(target: Target, tokens: Sequence[int]) -> np.ndarray:
    """(n, vocab) logits of tokens fed as one chain tree (one pass), then committed."""
    logits = target.forward_tree(DraftTree.chain(int(tokens[0]), [int(t) for t in tokens[1:]]))
    target.commit(list(range(len(tokens))))
    return logits


def measure_batch_noise(target: Target, tokens: Sequence[int]) -> dict:
    """Compare `tokens` fed one at a time with the same tokens as one chain tree.

    The cache must hold the context before tokens[0] (tokens[0] is the next, unseen token); it is
    left as it was. The margin change is measured on the one-by-one run's top-2 tokens (a, b):
    Δgap = (chain[a] - chain[b]) - (single[a] - single[b]); an argmax flips only where
    |Δgap| exceeds the margin.
    """
    start = target.n_cached
    single = logits_one_by_one(target, tokens).astype(np.float64)
    target.truncate(start)
    chain = logits_as_chain(target, tokens).astype(np.float64)
    target.truncate(start)

    rows = np.arange(len(tokens))
    top2 = np.argsort(single, axis=1)[:, -2:]  # (n, 2): [second, first]
    a, b = top2[:, 1], top2[:, 0]
    gap_single = single[rows, a] - single[rows, b]
    gap_chain = chain[rows, a] - chain[rows, b]
    gap_delta = np.abs(gap_chain - gap_single)
    return {
        "n_tokens": len(tokens),
        "max_gap_delta": float(gap_delta.max()),
        "p95_gap_delta": float(np.percentile(gap_delta, 95)),
        "max_logit_delta": float(np.abs(chain - single).max()),
        "argmax_flips": int(np.sum(chain.argmax(1) != single.argmax(1))),
        "min_margin": float(gap_single.min()),
    }
