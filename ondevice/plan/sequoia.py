"""Sequoia's dynamic program: the draft-tree shape with the most expected accepted tokens.

Input: p[k] = probability that the k-th ranked draft child (k = 0 is the drafter's top-1) is the
one the target accepts, measured on calibration text and assumed the same at every node. A tree's
expected tokens per target pass is the sum, over its nodes, of the probability that the whole
root→node path is accepted (the root counts 1: the target's own bonus token is always emitted):

    E[accepted + 1] = Σ_v Π_{u on root→v, u ≠ root} p[rank(u)]

The DP (Sequoia, with "at most m nodes" instead of "exactly m"; m counts the root, budget = m − 1):

    G[0][m]    = 1                                          root alone (m ≥ 1)
    H_d[0][m]  = 1
    H_d[b][m]  = max_{1≤y<m} H_d[b−1][y] + p[b−1]·G[d−1][m−y]   root has b children; the b-th one
                                                            (rank b−1) gets m−y nodes, depth ≤ d−1
    G[d][m]    = max_b H_d[b][m]                            best tree, ≤ m nodes, depth ≤ d

Each H_d[b] is a (max, +) convolution, done for all m at once as an (m, y) matrix. A drafter fills
the reconstructed static shape: node i is the rank-`ranks[i]` child of `parents[i]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ondevice.decode.tree import depths_of

MAX_DEPTH = 24  # deeper levels add < p1^24 ≈ 3% of a token at p1 = 0.86; the DP cost is linear in it
MAX_RANK = 8  # children per node the DP may use (p beyond rank 8 is negligible in practice)


@dataclass(frozen=True)
class TreeShape:
    """A static draft-tree shape in breadth-first order (node 0 is the root)."""

    parents: np.ndarray  # (n,) int64; parents[0] == -1, parents[i] < i
    ranks: np.ndarray  # (n,) int64; node i is the ranks[i]-th best child of parents[i] (root: -1)
    tokens_per_pass: float  # E[accepted drafts + 1] under the p it was built for

    @property
    def budget(self) -> int:
        return len(self.parents) - 1

    @property
    def depths(self) -> np.ndarray:
        return depths_of(self.parents)

    @property
    def depth(self) -> int:
        return int(self.depths.max())


def tree_tokens_per_pass(parents: np.ndarray, ranks: np.ndarray, p_rank: np.ndarray) -> float:
    """E[accepted + 1] of any shape, straight from the definition: Σ_v P(root→v all accepted)."""
    p_rank = np.asarray(p_rank, dtype=np.float64)
    reach = np.ones(len(parents))  # reach[v] = Π p[rank] along root→v
    for v in range(1, len(parents)):
        reach[v] = reach[parents[v]] * (p_rank[ranks[v]] if ranks[v] < len(p_rank) else 0.0)
    return float(reach.sum())


def chain_tokens_per_pass(p1: float, budget: int) -> float:
    """A chain of `budget` top-1 drafts: 1 + Σ_{i=1..k} p1^i = 1 + p1(1 − p1^k)/(1 − p1)."""
    if p1 >= 1.0:
        return 1.0 + budget
    return 1.0 + p1 * (1.0 - p1**budget) / (1.0 - p1)


def _maxplus_index(n: int) -> np.ndarray:
    """(n, n) int: idx[m, y] = m − y where that is ≥ 1, else 0 (slot 0 of every row vector is −inf)."""
    m = np.arange(n)
    return np.clip(m[:, None] - m[None, :], 0, None)


class SequoiaTable:
    """G[d][m] for all depths ≤ max_depth and node counts ≤ max_budget + 1, plus the argmaxes."""

    def __init__(self, p_rank, max_budget: int = 1024, max_depth: int = MAX_DEPTH):
        p = np.asarray(p_rank, dtype=np.float64)[:MAX_RANK]
        if len(p) == 0 or np.any(p < 0) or p.sum() > 1 + 1e-9:
            raise ValueError("p_rank must be non-negative probabilities summing to at most 1")
        self.p_rank = p
        self.max_budget = max_budget
        self.max_depth = max_depth
        n = max_budget + 2  # slots m = 0 … max_budget + 1
        k = len(p)
        # G[d][m]: best E[accepted + 1] with ≤ m nodes (root included) and depth ≤ d
        self.G = np.full((max_depth + 1, n), -np.inf)
        self.G[0, 1:] = 1.0
        self.best_children = np.zeros((max_depth + 1, n), dtype=np.int16)  # argmax_b H_d[b][m]
        self.split = np.zeros((max_depth + 1, k + 1, n), dtype=np.int32)  # argmax_y of H_d[b][m]
        idx = _maxplus_index(n)
        rows = np.arange(n)
        for d in range(1, max_depth + 1):
            H = self.G[0].copy()  # H_d[0]: the root with no children
            best = H.copy()
            best_b = np.zeros(n, dtype=np.int16)
            for b in range(1, k + 1):
                child = p[b - 1] * self.G[d - 1]
                child[0] = -np.inf
                scores = H[None, :] + child[idx]  # (m, y): H_d[b−1][y] + p[b−1]·G[d−1][m−y]
                y = scores.argmax(axis=1)
                H = scores[rows, y]
                self.split[d, b] = y
                better = H > best + 1e-12  # ties keep fewer children
                best = np.where(better, H, best)
                best_b = np.where(better, b, best_b)
            self.G[d] = best
            self.best_children[d] = best_b

    def tokens_per_pass(self, budget: int, depth: int) -> float:
        """E[accepted + 1] of the best tree with ≤ budget drafted nodes and depth ≤ depth."""
        self._check(budget, depth)
        return float(self.G[depth, budget + 1])

    def shape(self, budget: int, depth: int) -> TreeShape:
        """Reconstruct the best tree, breadth-first, children of a node in rank order."""
        self._check(budget, depth)
        parents, ranks = [-1], [-1]
        queue = [(0, budget + 1, depth)]  # (node, nodes it may use incl. itself, depth left)
        for node, m, d in queue:  # the queue grows while we walk it: breadth-first
            if d == 0:
                continue
            children = []
            for b in range(int(self.best_children[d, m]), 0, -1):  # peel the last child off first
                y = int(self.split[d, b, m])
                children.append((b - 1, m - y))
                m = y
            for rank, size in reversed(children):
                parents.append(node)
                ranks.append(rank)
                queue.append((len(parents) - 1, size, d - 1))
        return TreeShape(np.array(parents, dtype=np.int64), np.array(ranks, dtype=np.int64), self.tokens_per_pass(budget, depth))

    def _check(self, budget: int, depth: int) -> None:
        if not (0 <= budget <= self.max_budget and 0 <= depth <= self.max_depth):
            raise ValueError(f"budget {budget} / depth {depth} outside this table ({self.max_budget} / {self.max_depth})")


@lru_cache(maxsize=8)
def _cached_table(p_key: tuple[float, ...], max_budget: int, max_depth: int) -> SequoiaTable:
    return SequoiaTable(np.array(p_key), max_budget, max_depth)


def sequoia_table(p_rank, max_budget: int = 1024, max_depth: int = MAX_DEPTH) -> SequoiaTable:
    """The DP table for this p, memoized (p rounded to 1e-4 so a drifting estimate reuses tables)."""
    p_key = tuple(round(float(x), 4) for x in np.asarray(p_rank)[:MAX_RANK])
    return _cached_table(p_key, max_budget, max_depth)


def optimal_tree(p_rank, budget: int, depth: int) -> TreeShape:
    """The shape a drafter should fill: ≤ budget drafted nodes, depth ≤ depth, most expected tokens."""
    depth = min(depth, budget)
    table_budget = 1 << max(budget, 1).bit_length()  # round up so nearby budgets share one table
    return sequoia_table(p_rank, table_budget, max(depth, MAX_DEPTH)).shape(budget, depth)
