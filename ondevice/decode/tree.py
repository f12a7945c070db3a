"""The draft tree: what a drafter proposes and a target verifies in one pass.

Node 0 is the root: the last committed token, which the target has not yet seen (its logits
predict the first drafted level). Every other node is a drafted token whose parent comes earlier
(nodes are in topological order), so the tree can be fed to a target as one batch, position
`n_cached + depth[i]`, attending to the cache and to its own ancestors (`ancestor_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (what a KV cache can keep)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def depths_of(parents: Sequence[int] | np.ndarray) -> np.ndarray:
    """(n,) int64 depth of every node of a tree given by its parents (parents[0] == -1, parents[i] < i)."""
    d = np.zeros(len(parents), dtype=np.int64)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


@dataclass
class DraftTree:
    tokens: np.ndarray  # (n,) int64 token ids; tokens[0] is the root
    parents: np.ndarray  # (n,) int64; parents[0] == -1, parents[i] < i
    logprobs: np.ndarray  # (n,) float64 cumulative draft log-prob of root→node (root: 0)
    # Drafter distributions over the children of expanded nodes (node -> (vocab,) probs), kept
    # only when a sampling verifier needs them (Sequoia's rule).
    q: dict[int, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        self.parents = np.asarray(self.parents, dtype=np.int64)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float64)
        n = len(self.tokens)
        if n == 0 or self.parents[0] != -1:
            raise ValueError("a draft tree needs a root (node 0, parent -1)")
        if len(self.parents) != n or len(self.logprobs) != n:
            raise ValueError("tokens, parents and logprobs must have the same length")
        if n > 1 and not np.all(self.parents[1:] < np.arange(1, n)):
            raise ValueError("parents must come before their children")
        if n > 1 and np.any(self.parents[1:] < 0):
            raise ValueError("only the root may lack a parent")

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def root_only(cls, root_token: int) -> "DraftTree":
        return cls(np.array([root_token]), np.array([-1]), np.zeros(1))

    @classmethod
    def chain(cls, root_token: int, tokens: list[int], logprobs: list[float] | None = None) -> "DraftTree":
        """A chain root→t1→t2…; logprobs are the per-step draft log-probs (summed here)."""
        steps = np.asarray(logprobs if logprobs is not None else [0.0] * len(tokens), dtype=np.float64)
        cum = np.concatenate([[0.0], np.cumsum(steps)])
        return cls(np.array([root_token, *tokens]), np.arange(-1, len(tokens)), cum)

    # --- shape --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> np.ndarray:
        return depths_of(self.parents)

    def children(self, node: int) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.parents == node)]

    def path_to(self, node: int) -> list[int]:
        """Node indices root→node, inclusive."""
        path = []
        while node != -1:
            path.append(int(node))
            node = int(self.parents[node])
        return path[::-1]

    def leaves(self) -> list[int]:
        has_child = np.zeros(len(self), dtype=bool)
        has_child[self.parents[1:]] = True
        return [int(i) for i in np.flatnonzero(~has_child)]

    def likely_path(self) -> list[int]:
        """Node ids root→leaf following, at each node, the child with the highest draft log-prob (the
        first on ties): the drafter's top-1 path."""
        best: dict[int, int] = {}  # parent -> its most likely child
        for i in range(1, len(self)):
            p = int(self.parents[i])
            if p not in best or self.logprobs[i] > self.logprobs[best[p]]:
                best[p] = i
        path = [0]
        while path[-1] in best:
            path.append(best[path[-1]])
        return path

    def subtree(self, node: int) -> "DraftTree":
        """`node` and its descendants as a tree rooted at `node`: what is still a draft once node's
        token is committed. Creation order, each node's children (in draw order) and its q row are
        kept; log-probs become relative to the new root."""
        inside = np.zeros(len(self), dtype=bool)
        inside[node] = True
        for i in range(node + 1, len(self)):  # parents come first, so one pass suffices
            inside[i] = inside[self.parents[i]]
        keep = np.flatnonzero(inside)
        new_id = np.full(len(self), -1, dtype=np.int64)
        new_id[keep] = np.arange(len(keep))
        parents = new_id[self.parents[keep]]
        parents[0] = -1  # the old parent of `node` is outside
        tree = DraftTree(self.tokens[keep], parents, self.logprobs[keep] - self.logprobs[node])
        tree.q = {int(new_id[n]): row for n, row in self.q.items() if inside[n]}
        return tree

    def ancestor_mask(self) -> np.ndarray:
        """(n, n) bool: mask[i, j] is True iff j is i or an ancestor of i (what node i attends to)."""
        n = len(self)
        mask = np.zeros((n, n), dtype=bool)
        for i in range(n):
            p = self.parents[i]
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask
