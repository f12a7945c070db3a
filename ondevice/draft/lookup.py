"""PromptLookupDrafter: a free drafter (no model) that proposes what followed the same n-gram before.

Prompt lookup decoding: take the last n tokens of the context (n from `max_ngram` down to
`min_ngram`, the longest n that occurs earlier wins), find where they occurred before, and propose
the tokens that followed each occurrence. Answers that copy or edit text from the prompt (rewrite
this function, fix this paragraph) repeat long runs of it, and each run costs the target one pass.

Several occurrences usually continue differently, so their continuations are merged into a trie:
most recent occurrence first, siblings ranked by how many occurrences support them (ties: the most
recent first). A node's draft "log-prob" estimates the chance the target follows its path:
Σ over the path of log(support(child) / support(parent)) + log(LEVEL_ACCEPT), since even a unanimous
continuation is not always what the target says, minus a hair per rank so that siblings with equal
support are strictly ordered (for `AcceptanceTracker`; it also sends such ties down the most recent
occurrence's branch first). The `budget` best nodes are kept, best-first from the root, so the kept
set is a tree. No earlier occurrence: a root-only tree, which costs the target nothing beyond a
plain decoding step.

Verification: the proposals are deterministic. SpecExec's rule (and greedy) accept the child equal
to the target's own choice and need no draft probabilities, so any trie is exact. Sequoia's rule
needs children drawn from q: a deterministic proposal is a draw from a point mass, so with
`spec.sample_children` the tree is the rank-0 chain with q = one-hot at each node's child — exact,
but siblings would be dead weight there (after rejecting the point mass, Q has nothing left).

Stateless and pure numpy: each call scans the whole context (4,000 tokens: ~0.2 ms, most of it
turning the list into an array), so a context that changes between calls (a new chat turn, an
edited prompt) needs no bookkeeping, and no n-gram index is worth keeping.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.decode.protocols import Drafter, DraftSpec
from ondevice.decode.tree import DraftTree
from ondevice.draft.free_tree import best_subtree

MAX_NGRAM = 3
# Bigrams, not unigrams: in a few thousand tokens almost every single token has occurred before, so
# unigram matches would put a (mostly wrong) tree into nearly every round, and on a CPU target a 7-node
# pass costs several 1-token passes (docs/measurements/2026-11-27-sized-free-rounds.md). A repeated
# bigram is far better evidence of a copied run.
MIN_NGRAM = 2
MAX_MATCHES = 8  # occurrences merged into the trie (the most recent ones)
LEVEL_ACCEPT = 0.8  # a guess at P(target follows a continuation one more token); only shapes the tree
RANK_EPSILON = 1e-6  # nats subtracted per sibling rank, so ties in support still order siblings


def find_matches(context: np.ndarray, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM, max_matches: int = MAX_MATCHES) -> tuple[int, list[int]]:
    """(n, starts): the longest n whose last-n-gram occurs earlier in `context`, and where each of
    its (up to max_matches most recent) occurrences' continuation starts, most recent first.
    (0, []) if no n-gram in [min_ngram, max_ngram] recurs."""
    length = len(context)
    for n in range(max_ngram, min_ngram - 1, -1):
        if length < n + 1:
            continue
        # window s covers context[s : s + n]; s < length - n so the suffix itself is excluded and
        # every window has at least one token after it
        hit = context[: length - n] == context[length - n]
        for i in range(1, n):
            hit &= context[i : length - n + i] == context[length - n + i]
        starts = np.flatnonzero(hit)
        if len(starts):
            return n, [int(s) + n for s in starts[::-1][:max_matches]]
    return 0, []


class _Trie:
    """Continuations merged by shared prefix; node 0 is the root (the context's last token)."""

    def __init__(self, root_token: int):
        self.tokens = [root_token]
        self.parent = [-1]
        self.support = [0]  # occurrences whose continuation passes through the node
        self.children: list[dict[int, int]] = [{}]

    def insert(self, continuation: Sequence[int]) -> None:
        node = 0
        self.support[0] += 1
        for token in continuation:
            child = self.children[node].get(token)
            if child is None:
                child = len(self.tokens)
                self.tokens.append(token)
                self.parent.append(node)
                self.support.append(0)
                self.children.append({})
                self.children[node][token] = child
            self.support[child] += 1
            node = child

    def ranked_children(self, node: int) -> list[int]:
        """By support, then by insertion order (the most recent occurrence inserted first)."""
        return sorted(self.children[node].values(), key=lambda c: (-self.support[c], c))

    def best(self, budget: int, chain_only: bool = False) -> DraftTree:
        """The `budget` nodes with the highest path score, best-first from the root (a subtree)."""

        def scored(node: int, score: float, depth: int):
            kids = self.ranked_children(node)[: 1 if chain_only else None]
            for rank, child in enumerate(kids):
                share = self.support[child] / self.support[node]
                yield child, score + np.log(share * LEVEL_ACCEPT) - RANK_EPSILON * rank, depth + 1

        return best_subtree(self.tokens, scored, budget)


class PromptLookupDrafter(Drafter):
    """Drafter protocol with no model: n-gram matches in the context propose a trie of continuations."""

    def __init__(self, n_vocab: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM, max_matches: int = MAX_MATCHES):
        if not 1 <= min_ngram <= max_ngram:
            raise OndeviceError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, not {min_ngram} and {max_ngram}.")
        self.n_vocab = n_vocab
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_matches = max_matches

    def draft(self, context: Sequence[int], spec: DraftSpec) -> DraftTree:
        if len(context) == 0:
            raise OndeviceError("prompt lookup needs a non-empty context.")
        if spec.budget < 0:
            raise OndeviceError(f"the draft budget must be >= 0, not {spec.budget}.")
        ids = np.asarray(context, dtype=np.int64)
        root = int(ids[-1])
        _, starts = find_matches(ids, self.max_ngram, self.min_ngram, self.max_matches)
        if not starts or spec.budget == 0:
            return DraftTree.root_only(root)
        trie = _Trie(root)
        for s in starts:
            trie.insert(ids[s : s + spec.budget].tolist())
        sequoia = spec.sample_children and spec.temperature > 0
        tree = trie.best(spec.budget, chain_only=sequoia)
        if sequoia:  # each node's one child is a draw from the point mass on it
            for child in range(1, len(tree)):
                q = np.zeros(self.n_vocab, dtype=np.float64)
                q[tree.tokens[child]] = 1.0
                tree.q[int(tree.parents[child])] = q
        return tree
