"""Hybrid trees: the free sources' proposals and the drafter model's best-first search grow one tree
under one budget.

The free tree (suffix matches, recycled candidates, prompt lookup, merged: draft/free_tree.py)
seeds the search with its own scores; then the best-first loop of `builders.build_best_first`
runs over the union:

- **one score per node**: a cumulative log-probability whose every step is the highest any
  source gave it (the free source's guess, or the drafter's log q once its parent is expanded;
  a model step above a free one lifts the node and everything below it);
- **one budget**: the kept set is always the `budget` best nodes of the union, which are a tree
  (steps are ≤ 0, parents are older than their children, ties go to the older node);
- **skipping**: a node one of whose free children has a step of at least log(COVER_P) is covered —
  the free source already says what comes next, confidently — and is not expanded for its own
  sake; its model alternatives are never asked for;
- **deepening past**: a kept node above the threshold whose ancestors were skipped is decoded
  together with them, top-down, in one drafter call (a free run of several tokens is one batch, not
  one call per token), so the model's proposals go on where the free run ends. In one call an
  undecoded parent gets at most one undecoded child: the child then continues the parent's own
  branch in the drafter's cache (tree_cache.DraftKV's path sequences, onnx_cache's slots).

Nodes decoded as ancestors give their distributions too, and they are merged like any other.
With no free proposals this is `build_best_first` (the same nodes, the same leaves left unexpanded).

Verification: SpecExec's rule and greedy accept the child equal to the target's own choice, so
the union is exact for them. Sequoia's rule needs every node's children drawn from the drafter's
q, which free proposals are not: for `spec.sample_children` the model drafter builds its sampled
best-first tree alone (`ModelDrafter.draft`).
"""

from __future__ import annotations

import math

import numpy as np

from ondevice.draft.builders import BATCH_SPREAD, LEAF_MARGIN, Round, search_step
from ondevice.draft.search_tree import SearchTree
from ondevice.decode.tree import DraftTree

COVER_P = 0.9  # a free child this likely covers its parent: the drafter does not expand the parent for its own sake


class HybridSearch:
    """The union being grown: the round's SearchTree, seeded with the free tree, and each node's step."""

    def __init__(self, tree: SearchTree, free: DraftTree, vocab: int):
        """vocab: the drafter's; a free node with an id past it (padding the drafter lacks) is left out, with all below it."""
        self.tree = tree
        self.children: list[dict[int, int]] = [{}]  # node -> token -> child
        self.steps: list[float] = [0.0]  # node -> its step (score minus its parent's)
        self.covered: set[int] = set()
        node_of = [0] * len(free)  # free node -> search node (-1: left out)
        for i in range(1, len(free)):
            parent = node_of[int(free.parents[i])]
            if parent < 0 or free.tokens[i] >= vocab:
                node_of[i] = -1
                continue
            step = float(free.logprobs[i] - free.logprobs[free.parents[i]])
            node_of[i] = self._add(parent, int(free.tokens[i]), step)
            if step >= math.log(COVER_P):
                self.covered.add(parent)

    def _add(self, parent: int, token: int, step: float) -> int:
        node = self.tree.add_children(parent, np.array([token]), np.array([step]))[0]
        self.children[parent][token] = node
        self.children.append({})
        self.steps.append(step)
        return node

    def merge(self, parent: int, tokens: np.ndarray, steps: np.ndarray, min_score: float) -> None:
        """The drafter's top children of an expanded node (best first, `Round.top`): new ones that
        score above min_score are added; a child a free source proposed keeps the higher of the two steps."""
        for token, step in zip(tokens.tolist(), steps.tolist()):
            child = self.children[parent].get(token)
            if child is not None:
                if step > self.steps[child]:
                    self._lift(child, step - self.steps[child])
                    self.steps[child] = step
            elif self.tree.scores[parent] + step > min_score:
                self._add(parent, token, step)

    def _lift(self, node: int, delta: float) -> None:
        """Raise the scores of `node` and everything below it by delta."""
        todo = [node]
        while todo:
            n = todo.pop()
            self.tree.scores[n] += delta
            self.tree.logprobs[n] += delta
            todo.extend(self.children[n].values())

    def closure(self, node: int) -> list[int]:
        """`node` and its ancestors not yet decoded, top-down."""
        chain = []
        while node != 0 and not self.tree.expanded[node]:
            chain.append(node)
            node = self.tree.parents[node]
        return chain[::-1]

    def batch(self, candidates: list[int], room: int) -> list[int]:
        """Candidates with their undecoded ancestors, top-down, at most `room` nodes, an undecoded parent
        with at most one undecoded child in the batch (see the module docstring)."""
        batch: list[int] = []
        placed: set[int] = set()
        has_child: set[int] = set()  # batch nodes with a child in the batch
        for node in candidates:
            chain = self.closure(node)
            new = [n for n in chain if n not in placed]
            if not new:
                continue
            parent = self.tree.parents[new[0]]  # decoded already, or in the batch (then it needs no other child there)
            if parent in has_child:
                continue
            if len(batch) + len(new) > room:
                if batch:
                    break
                new = new[:room]  # a free run longer than one call: its top first
            if parent in placed:
                has_child.add(parent)
            has_child.update(new[:-1])
            placed.update(new)
            batch += new
        return batch


def build_hybrid(
    r: Round, root_logp: np.ndarray, free: DraftTree, max_batch: int, spread: float = BATCH_SPREAD, margin: float = LEAF_MARGIN
) -> DraftTree:
    tree, k = r.tree, min(r.spec.budget, len(root_logp))
    search = HybridSearch(tree, free, r.n_vocab or len(root_logp))
    search.merge(0, *r.top(root_logp, k), -np.inf)
    while True:
        kept, threshold, candidates = search_step(r, spread, margin, skip=search.covered)
        nodes = search.batch(candidates, min(max_batch, r.expander.free_capacity()))
        if not nodes:
            return tree.to_draft_tree(kept)
        for node, logp in zip(nodes, r.expand(nodes)):
            search.merge(node, *r.top(logp, k), threshold)
