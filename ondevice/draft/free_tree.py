"""What the free drafters (no model: suffix, recycle, lookup) share: merging their proposals into one
weighted trie, keeping the `budget` best nodes of it, and the tree Sequoia's rule can verify.

A free source scores a node by a guess at log P(the target follows the path to it): a sum of
per-step log-probabilities, each < 0, so a child never scores above its parent and the `budget`
best nodes of a trie always form a tree (ancestor-closed). Merged proposals keep, per node, the
highest step any source gave it (the most confident source wins); siblings are ranked by score,
ties by the order the sources were merged in.

Verification (ondevice.decode.verify): greedy and SpecExec accept the child equal to the target's own
choice, so any proposed tree is exact and no draft probabilities are needed. Sequoia's rule needs
children drawn from q: a deterministic proposal is a draw from a point mass, so for it the tree is
cut to its best chain with q one-hot at each node (`point_mass_chain`) — exact, as for prompt lookup.
"""

from __future__ import annotations

import heapq

import numpy as np

from ondevice.decode.tree import DraftTree


class FreeTrie:
    """Proposals merged by token path; node 0 is the root (the context's last token)."""

    def __init__(self, root_token: int):
        self.tokens = [int(root_token)]
        self.steps = [0.0]  # node -> the best log-prob step any source gave it
        self.children: list[dict[int, int]] = [{}]  # node -> token -> node

    def __len__(self) -> int:
        return len(self.tokens)

    def insert(self, tree: DraftTree) -> None:
        """Merge a proposed tree rooted at the same token (its logprobs are cumulative)."""
        node_of = [0] * len(tree)  # tree node -> trie node
        for i in range(1, len(tree)):
            parent = int(tree.parents[i])
            step = float(tree.logprobs[i] - tree.logprobs[parent])
            node_of[i] = self.add(node_of[parent], int(tree.tokens[i]), step)

    def add(self, parent: int, token: int, step: float) -> int:
        """The child of `parent` spelling `token` (made if new), its step raised to `step` if lower."""
        child = self.children[parent].get(token)
        if child is None:
            child = len(self.tokens)
            self.tokens.append(token)
            self.steps.append(step)
            self.children.append({})
            self.children[parent][token] = child
        else:
            self.steps[child] = max(self.steps[child], step)
        return child

    def best(self, budget: int, max_depth: int | None = None) -> DraftTree:
        """The `budget` best-scoring nodes, best-first from the root (so a tree), none deeper than max_depth."""

        def scored(node: int, score: float, depth: int):
            if max_depth is not None and depth >= max_depth:
                return ()
            return ((child, score + self.steps[child], child) for child in self.children[node].values())

        return best_subtree(self.tokens, scored, budget)


def best_subtree(tokens_of: list[int], scored_children, budget: int) -> DraftTree:
    """The `budget` best-scoring nodes of a trie (node 0 its root; tokens_of[node] its token), taken
    best-first from the root, so that they form a tree. scored_children(node, score, depth) gives
    (child, its score, a key that orders equal scores) for each child worth taking."""
    tokens, parents, logprobs = [tokens_of[0]], [-1], [0.0]
    heap: list[tuple[float, float, int, int, int]] = []  # (-score, tie key, trie node, out parent, depth)

    def push_children(node: int, out: int, depth: int) -> None:
        for child, score, tie in scored_children(node, logprobs[out], depth):
            heapq.heappush(heap, (-score, tie, child, out, depth + 1))

    push_children(0, 0, 0)
    while heap and len(tokens) <= budget:
        neg_score, _, node, out_parent, depth = heapq.heappop(heap)
        tokens.append(tokens_of[node])
        parents.append(out_parent)
        logprobs.append(-neg_score)
        push_children(node, len(tokens) - 1, depth)
    return DraftTree(np.array(tokens), np.array(parents), np.array(logprobs))


def merge_trees(trees: list[DraftTree], budget: int, max_depth: int | None = None) -> DraftTree:
    """The trees' union (same root), cut to its `budget` best nodes."""
    trie = FreeTrie(int(trees[0].tokens[0]))
    for tree in trees:
        trie.insert(tree)
    return trie.best(budget, max_depth)


def point_mass_chain(tree: DraftTree, n_vocab: int) -> DraftTree:
    """The best chain of `tree`, each node's one child a draw from the point mass on it (q one-hot):
    the tree Sequoia's rule verifies exactly for a deterministic proposal."""
    path = tree.likely_path()
    chain = DraftTree(tree.tokens[path], np.arange(-1, len(path) - 1), tree.logprobs[path])
    for child in range(1, len(chain)):
        q = np.zeros(n_vocab, dtype=np.float64)
        q[chain.tokens[child]] = 1.0
        chain.q[child - 1] = q
    return chain


def for_rule(tree: DraftTree, sample_children: bool, temperature: float, n_vocab: int) -> DraftTree:
    """`tree` as the verification rule of this spec needs it: itself, or its point-mass chain for Sequoia's."""
    return point_mass_chain(tree, n_vocab) if sample_children and temperature > 0 else tree
