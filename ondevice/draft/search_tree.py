"""The tree a drafter grows during one round, and how children are picked from a distribution.

`SearchTree` holds every node proposed so far (node 0 is the root): token, parent, depth, the true
cumulative draft log-prob, and a ranking score. For top-k children the score *is* the cumulative
log-prob; for children sampled without replacement the score is made non-increasing in draw order
(see `sampled_children`), so whatever subset a builder keeps is a prefix of each node's draws, as
Sequoia's verification rule requires. `to_draft_tree` turns a kept, ancestor-closed subset into the
`DraftTree` the target verifies, in creation order (parents before children, siblings in draw order).

A top-k node keeps the k most likely children it was expanded with (`candidates`), of which a
builder adds only those that can still enter its top `budget`. `subtree` re-roots the search at a
node the target went on to (the next round's root, SpecExec's tree reuse): its expanded nodes keep
their distributions and get all their k candidates back, so the next round expands only what the
last one did not.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ondevice.decode.tree import DraftTree


def log_probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """(n, vocab) float32 log-softmax of logits / temperature (temperature 0 means 1: greedy ranking).
    One array besides the logits, a row's exponentials at a time: a drafter's batch of rows is RAM a
    streaming target's kept layers give up (loading/memory.py, `decode_slack`)."""
    scaled = logits / np.float32(temperature) if temperature > 0 else np.array(logits, dtype=np.float32)
    scaled -= scaled.max(axis=-1, keepdims=True)
    for row in scaled.reshape(-1, scaled.shape[-1]):
        row -= np.log(np.exp(row).sum())
    return scaled


def top_children(logp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely tokens of one (vocab,) log-prob row, most likely first."""
    ids = np.arange(len(logp))
    if k < len(ids):
        ids = ids[np.argpartition(-logp[ids], k - 1)[:k]]
    ids = ids[np.lexsort((ids, -logp[ids]))]  # by log-prob, ties by token id
    return ids, logp[ids]


def sampled_children(logp: np.ndarray, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """k tokens drawn without replacement from exp(logp) (Gumbel top-k), in draw order. Tokens of
    probability 0 (-inf: a trimmed vocabulary, a top-k cut) get no Gumbel key: a draw over the
    others alone has the same law and costs a fraction of the whole vocabulary's."""
    finite = np.isfinite(logp)
    ids = None if finite.all() else np.flatnonzero(finite)  # None: every token may be drawn
    row = logp if ids is None else logp[ids]
    k = min(k, len(row))
    keys = row + rng.gumbel(size=len(row)).astype(np.float32)
    top = np.argpartition(-keys, k - 1)[:k] if k < len(keys) else np.arange(len(keys))
    top = top[np.argsort(-keys[top], kind="stable")]
    top = top if ids is None else ids[top]
    return top, logp[top]


class SearchTree:
    """Nodes proposed while drafting one round; node 0 is the root (the last committed token)."""

    def __init__(self, root_token: int):
        self.tokens: list[int] = [int(root_token)]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.logprobs: list[float] = [0.0]  # cumulative draft log-prob root→node
        self.scores: list[float] = [0.0]  # ranking score (== logprobs unless children were sampled)
        self.expanded: list[bool] = [False]  # has the drafter computed this node's next-token distribution?
        self.q: dict[int, np.ndarray] = {}  # expanded node -> tempered draft probs over the vocabulary
        self.k = 0  # top-k drafting: how many children each expanded node knows (0: sampled, or not set)
        self.candidates: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # expanded node -> top-k (tokens, step log-probs)
        self.n_added: dict[int, int] = {}  # expanded node -> how many of its candidates are children

    def __len__(self) -> int:
        return len(self.tokens)

    def follow(self, nodes, tokens: Sequence[int]) -> list[int]:
        """The nodes among `nodes` that spell `tokens` from the root, as far as they go."""
        child_of = {(self.parents[n], self.tokens[n]): n for n in nodes}
        path, node = [], 0
        for token in tokens:
            node = child_of.get((node, token))
            if node is None:
                break
            path.append(node)
        return path

    def add_children(
        self, parent: int, tokens: np.ndarray, step_logprobs: np.ndarray, sampled: bool = False, min_score: float = -np.inf
    ) -> list[int]:
        """Append children of `parent`, given best first (top-k) or in draw order (sampled).

        Scores are non-increasing along `tokens` either way, so the first child scoring <= min_score
        (one that can never be kept) ends the list.
        """
        lp = self.logprobs[parent] + np.asarray(step_logprobs, dtype=np.float64)
        steps = np.minimum.accumulate(step_logprobs) if sampled else step_logprobs
        scores = self.scores[parent] + np.asarray(steps, dtype=np.float64)
        new = []
        for token, logprob, score in zip(tokens, lp, scores):
            if score <= min_score:
                break
            new.append(len(self.tokens))
            self.tokens.append(int(token))
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1)
            self.logprobs.append(float(logprob))
            self.scores.append(float(score))
            self.expanded.append(False)
        return new

    def add_candidates(self, parent: int, min_score: float = -np.inf) -> list[int]:
        """Add the parent's next candidates (best first) that score above min_score."""
        tokens, steps = self.candidates[parent]
        start = self.n_added[parent]
        new = self.add_children(parent, tokens[start:], steps[start:], min_score=min_score)
        self.n_added[parent] = start + len(new)
        return new

    def unexpanded(self, n: int, alive) -> list[int]:
        """The n best-scoring nodes not expanded yet whose parent is in `alive` (best first)."""
        ids = [i for i in range(1, len(self.tokens)) if not self.expanded[i] and self.parents[i] in alive]
        ids.sort(key=lambda i: (-self.scores[i], i))
        return ids[:n]

    def subtree(self, root: int, expanded: set[int]) -> tuple["SearchTree", dict[int, int]]:
        """The search re-rooted at `root` (which must be in `expanded`): the nodes below it whose
        parents are in `expanded` (the expanded nodes still usable: their KV is cached), log-probs
        and scores counted from the new root, every usable expanded node with all its top-k
        candidates as children. Returns the tree and old id -> new id."""
        new = SearchTree(self.tokens[root])
        new.k = self.k
        new_id = {root: 0}
        for old in range(root + 1, len(self.tokens)):  # children come after their parents
            parent = self.parents[old]
            if parent in new_id and parent in expanded:
                new_id[old] = len(new.tokens)
                new.tokens.append(self.tokens[old])
                new.parents.append(new_id[parent])
                new.depths.append(self.depths[old] - self.depths[root])
                new.logprobs.append(self.logprobs[old] - self.logprobs[root])
                new.scores.append(self.scores[old] - self.scores[root])
                new.expanded.append(False)
        for old, node in new_id.items():
            if old in expanded:
                new.expanded[node] = True
                new.candidates[node], new.n_added[node] = self.candidates[old], self.n_added[old]
                if old in self.q:
                    new.q[node] = self.q[old]
        for node in list(new.candidates):
            new.add_candidates(node)
        return new, new_id

    def best(self, n: int, max_depth: int | None = None) -> list[int]:
        """The n best non-root nodes by score (ties: older first), best first; none deeper than
        max_depth (a carried search may hold deeper nodes)."""
        scores = np.asarray(self.scores[1:])
        ids = np.arange(1, len(self.scores))
        if max_depth is not None:
            shallow = np.asarray(self.depths[1:]) <= max_depth
            scores, ids = scores[shallow], ids[shallow]
        if n < len(ids):
            cut = np.argpartition(-scores, n - 1)[:n]
            # argpartition may split a tie at the cut arbitrarily: take every node scoring >= the cut
            # and let the sort below (score desc, id asc) decide.
            cut = np.flatnonzero(scores >= scores[cut].min())
            scores, ids = scores[cut], ids[cut]
        order = np.lexsort((ids, -scores))[:n]
        return [int(i) for i in ids[order]]

    def path(self, node: int) -> list[int]:
        """Node ids root→node inclusive."""
        out = []
        while node != -1:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def to_draft_tree(self, nodes: Sequence[int]) -> DraftTree:
        """The DraftTree of the root plus `nodes` (ancestor-closed), in creation order."""
        keep = sorted({0, *(int(n) for n in nodes)})
        new_id = {old: new for new, old in enumerate(keep)}
        parents = [-1] + [new_id[self.parents[n]] for n in keep[1:]]
        tree = DraftTree(
            np.array([self.tokens[n] for n in keep]),
            np.array(parents),
            np.array([self.logprobs[n] for n in keep]),
        )
        tree.q = {new_id[n]: q for n, q in self.q.items() if n in new_id}
        return tree
