"""Draft-tree builders: chain, best-first (SpecExec) and multi-sequence (DuoDecoding).

Each builder grows a `SearchTree` from the root's log-probs, asking an `Expander` (the drafter's
KV cache) to decode batches of nodes; every node decoded in one call is one llama_decode row.

- chain:      `budget` tokens, each the most likely (or a sample) after the previous one.
- best-first: repeatedly expand the kept nodes with the highest cumulative log-prob, up to
              `max_batch` per decode (those within `spread` nats of the best); keep the `budget`
              best nodes; stop when no unexpanded kept node scores more than `margin` nats above
              the weakest kept one: a child of such a node enters only if likelier than e^-margin,
              and then displaces only that weakest node, for a drafter row of its own. With
              `spec.max_depth` nodes at that depth are never expanded (the depth the planner
              priced). Each expansion proposes its top-min(budget, vocab) children, so (up to batch
              noise) with margin 0 the result is exactly the `budget` most likely nodes of the
              drafter's full tree, whatever the batching. (If more than 255 expanded branches are
              alive at once, llama.cpp has no sequence ids left and the search ends with what it has.)
- multi-seq:  θ = p₁,₁·p₂,₁ (top-1 probs at the first two positions of the greedy chain); the
              first-position candidates with probability above θ (at most 8) each start a sequence,
              all drafted greedily in lockstep (one decode per step), `budget // n_seqs` tokens each.

With temperature > 0 the tempered distribution q of every expanded node goes into `tree.q`;
with `sample_children` children are drawn without replacement from q (Gumbel top-k) instead.
"""

from __future__ import annotations

from typing import Container, Protocol, Sequence

import numpy as np

from ondevice.draft.search_tree import SearchTree, log_probs, sampled_children, top_children
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree

MULTI_SEQ_MAX_SEQUENCES = 8  # DuoDecoding's cap on first-position candidates
# best-first decodes together only the frontier nodes within BATCH_SPREAD nats of the best one: the
# others are likely to be pruned before they matter. Same tree, fewer wasted rows
# (docs/measurements/code-notes.md, "Best-first's batches").
BATCH_SPREAD = 1.0
# best-first leaves a kept node unexpanded when it scores no more than LEAF_MARGIN nats above the
# weakest kept node: its children would rarely enter the tree and then add only as much as the node
# they displace, for a drafter row each (docs/measurements/code-notes.md, "Best-first's leaves").
LEAF_MARGIN = 1.0


class Columns(Protocol):
    """What a drafter's logits columns stand for when they are not the whole vocabulary (a
    VocabTrim head: column i is token keep_ids[i], every other token has probability 0)."""

    keep_ids: np.ndarray  # ascending token ids, one per column
    n_vocab_full: int  # the vocabulary they are ids of

    def to_target_ids(self, draft_ids) -> np.ndarray: ...
    def to_target_probs(self, probs: np.ndarray) -> np.ndarray: ...


class Expander(Protocol):
    columns: Columns | None  # None: column i of the logits is token i

    def expand(self, tree: SearchTree, nodes: Sequence[int]) -> np.ndarray: ...  # (len(nodes), columns) logits
    def free_capacity(self) -> int: ...
    def release(self, tree: SearchTree, alive: set[int]) -> None: ...


class Round:
    """One drafting round: the spec, the tree being grown and the source of randomness."""

    def __init__(self, spec: DraftSpec, root_token: int, expander: Expander, position: int = 0, tree: SearchTree | None = None):
        """tree: the last round's search re-rooted at root_token (`SearchTree.subtree`), to grow on."""
        self.spec = spec
        self.tree = tree if tree is not None else SearchTree(root_token)
        self.expander = expander
        # A fresh stream per context length: rounds must not reuse one Gumbel draw (Sequoia's rule
        # is exact only if each round's children are independent draws from q).
        self.rng = np.random.default_rng([spec.seed, position])
        self.sampled = spec.sample_children and spec.temperature > 0  # greedy drafting ignores sample_children
        self.columns = expander.columns  # a search ranks the columns it is given, and keeps token ids
        self.expansions = 0  # nodes this round decoded

    @property
    def n_vocab(self) -> int | None:
        """The vocabulary a narrow drafter's columns come from (None: as wide as its logits)."""
        return None if self.columns is None else self.columns.n_vocab_full

    def token_ids(self, columns: np.ndarray) -> np.ndarray:
        return columns if self.columns is None else self.columns.to_target_ids(columns)

    def expand(self, nodes: Sequence[int]) -> np.ndarray:
        """Log-probs (len(nodes), vocab) of the children of these nodes; records q if sampling."""
        self.expansions += len(nodes)
        return self.distributions(nodes, self.expander.expand(self.tree, nodes))

    def distributions(self, nodes: Sequence[int], logits: np.ndarray) -> np.ndarray:
        """Log-probs over the logits' columns; q (if sampling) over the whole vocabulary."""
        logp = log_probs(logits, self.spec.temperature)
        for node, row in zip(nodes, logp):
            self.tree.expanded[node] = True
            if self.spec.temperature > 0:
                q = np.exp(row)
                self.tree.q[node] = q if self.columns is None else self.columns.to_target_probs(q)
        return logp

    def top(self, logp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k most likely children in one row of `expand`'s log-probs: (token ids, step log-probs)."""
        columns, steps = top_children(logp, k)
        return self.token_ids(columns), steps

    def add(self, parent: int, logp: np.ndarray, k: int, min_score: float = -np.inf) -> list[int]:
        """Add up to k children of `parent` (top-k, or drawn from q) that score above min_score."""
        if self.sampled:
            columns, steps = sampled_children(logp, k, self.rng)
            return self.tree.add_children(parent, self.token_ids(columns), steps, True, min_score)
        # all top-k are kept as candidates: a later round re-rooted below this node may need them
        self.tree.candidates[parent], self.tree.n_added[parent] = self.top(logp, k), 0
        return self.tree.add_candidates(parent, min_score)


def build_chain(r: Round, root_logp: np.ndarray) -> DraftTree:
    node, logp = 0, root_logp
    for step in range(r.spec.budget):
        node = r.add(node, logp, 1)[0]
        if step + 1 < r.spec.budget:
            logp = r.expand([node])[0]
    return r.tree.to_draft_tree(range(len(r.tree)))


def search_step(r: Round, spread: float, margin: float, skip: Container[int] = ()) -> tuple[list[int], float, list[int]]:
    """One step of a best-first search over r.tree (best-first's and the hybrid's): (the `budget` best
    nodes within the planned depth, best first; the weakest one's score, -inf while there are fewer;
    the kept nodes to expand next). Those are unexpanded, not in `skip`, above the planned depth, more
    than `margin` nats above the weakest kept node, and within `spread` nats of the best of them.
    The drafter's cache lets go of every node not kept."""
    budget, tree, max_depth = r.spec.budget, r.tree, r.spec.max_depth
    kept = tree.best(budget, max_depth)
    threshold = tree.scores[kept[-1]] if len(kept) == budget else -np.inf
    r.expander.release(tree, {0, *kept})
    waiting = [
        n for n in kept
        if not tree.expanded[n] and n not in skip and tree.scores[n] > threshold + margin
        and (max_depth is None or tree.depths[n] < max_depth)
    ]  # fmt: skip
    if waiting:  # nodes far below the best one are likely to be pruned before they matter: later
        waiting = [n for n in waiting if tree.scores[n] >= tree.scores[waiting[0]] - spread]
    return kept, threshold, waiting


def build_best_first(
    r: Round, root_logp: np.ndarray | None, max_batch: int, spread: float = BATCH_SPREAD, margin: float = LEAF_MARGIN
) -> DraftTree:
    """root_logp None: r.tree is a carried search whose root is expanded already."""
    budget, tree = r.spec.budget, r.tree
    n_children = tree.k if root_logp is None else min(budget, len(root_logp))
    if root_logp is not None:
        r.add(0, root_logp, n_children)
        tree.k = 0 if r.sampled else n_children  # what a carried search knows of each expanded node
    while True:
        kept, threshold, frontier = search_step(r, spread, margin)
        frontier = frontier[: min(max_batch, r.expander.free_capacity())]
        if not frontier:
            return tree.to_draft_tree(kept)
        for node, logp in zip(frontier, r.expand(frontier)):
            r.add(node, logp, n_children, min_score=threshold)


def build_multi_seq(r: Round, root_logp: np.ndarray) -> DraftTree:
    budget, tree = r.spec.budget, r.tree
    heads = r.add(0, root_logp, min(MULTI_SEQ_MAX_SEQUENCES, budget))
    if budget == 1:
        return tree.to_draft_tree(heads[:1])
    first_logp = r.expand(heads[:1])[0]
    p_first = np.exp([tree.logprobs[h] for h in heads])
    theta = float(np.exp(root_logp.max() + first_logp.max()))
    n_seqs = int(np.clip(np.count_nonzero(p_first > theta), 1, len(heads)))
    length = budget // n_seqs
    seqs = [[h] for h in heads[:n_seqs]]
    pending = {heads[0]: first_logp}  # last node of a sequence -> its children's log-probs
    while True:
        for seq in seqs:  # grow every sequence whose last node has been expanded
            if len(seq) < length and seq[-1] in pending:
                seq.append(r.add(seq[-1], pending.pop(seq[-1]), 1)[0])
        todo = [seq[-1] for seq in seqs if len(seq) < length and seq[-1] not in pending]
        if not todo:
            return tree.to_draft_tree([n for seq in seqs for n in seq])
        pending.update(zip(todo, r.expand(todo)))
