"""TokenRecycler: Token Recycling's adjacency of next-token candidates, filled from the target's logits.

Token Recycling (Luo et al. 2024): every verification pass computes the target's distribution
after every tree node, and all but one token of each is thrown away. Keep, per token t, the top-k
tokens the target ranked after t the last time it verified a node holding t (an adjacency
"matrix", rows replaced as new passes come), and propose a tree from the context's last token by
breadth-first search over it: its candidates, their candidates, … The paper fills a fixed tree
template level by level; here the same search keeps the `budget` nodes with the highest product
of the stored probabilities (best-first, each level from the one above), which is what a template
tuned on the stored probabilities approximates.

`learn(tree, logits, path)` is the engine's hook after each verification (every round, whatever
drafted the tree, the target alone included). It reads at most LEARN_ROWS rows: the accepted path's
(their contexts really happened; they win where a token occurs twice), then the other nodes in tree
order (the paper reads them all; this keeps a pass's learning under ~1 ms). A row's top-k comes from
the best GROUP_COLUMNS-strided columns (`top_k_rows`), far faster than `np.argpartition`
(docs/measurements/code-notes.md).

Memory: n_vocab × TOP_K int32 tokens + float16 log-probs, made at the first `learn`
(Qwen2.5's 151,936 ids: 7.3 MB). Stored log-probs are normalised over the column maxima, a lower
bound of the row's log-sum-exp, so they slightly overestimate the probability (a guess that shapes
the tree; the target decides what is accepted).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence

import numpy as np

from ondevice.draft.free_tree import for_rule
from ondevice.errors import OndeviceError
from ondevice.decode.protocols import Drafter, DraftSpec
from ondevice.decode.tree import DraftTree

TOP_K = 8  # candidates kept per token (the paper's k)
LEARN_ROWS = 8  # logits rows read per verification pass (see the module docstring)
TOKEN_TYPE, LOGP_TYPE = np.int32, np.float16  # the table's candidate ids and their log-probs


def table_bytes(n_vocab: int, top_k: int = TOP_K) -> int:
    """What the candidates' table holds once made (the memory plan leaves a streaming target room for it)."""
    return n_vocab * top_k * (np.dtype(TOKEN_TYPE).itemsize + np.dtype(LOGP_TYPE).itemsize)
GROUP_COLUMNS = 64  # top_k_rows: the row is cut into this many interleaved groups


def top_k_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, k) token ids and (n, k) estimated log-probs of the k largest logits of each row, best first.

    Columns j, j + w, j + 2w, … (w = vocab // GROUP_COLUMNS) form a group; a top-k entry lies in
    one of the k groups whose maxima are largest, so only those k·GROUP_COLUMNS entries (and the
    few past the last whole group) are ranked.
    """
    n, vocab = logits.shape
    w = vocab // GROUP_COLUMNS
    if w < k:  # a small vocabulary: rank it all
        tokens = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        vals = np.take_along_axis(logits, tokens, 1).astype(np.float64)
        lse = np.log(np.exp(logits - vals[:, :1]).sum(axis=1, keepdims=True)) + vals[:, :1]
        return tokens.astype(np.int64), (vals - lse).astype(np.float32)
    groups = logits[:, : w * GROUP_COLUMNS].reshape(n, GROUP_COLUMNS, w)  # (n, G, w)
    col_max = groups.max(axis=1)  # (n, w)
    cols = np.argpartition(col_max, -k, axis=1)[:, -k:]  # (n, k)
    cand = np.take_along_axis(groups, cols[:, None, :], axis=2).reshape(n, -1)  # (n, G·k)
    ids = (np.arange(GROUP_COLUMNS)[None, :, None] * w + cols[:, None, :]).reshape(n, -1)
    tail = logits[:, w * GROUP_COLUMNS :]  # (n, vocab mod G)
    cand = np.concatenate([cand, tail], axis=1)
    ids = np.concatenate([ids, np.broadcast_to(np.arange(w * GROUP_COLUMNS, vocab), tail.shape)], axis=1)
    best = np.argpartition(-cand, k - 1, axis=1)[:, :k]  # (n, k), unordered
    vals, tokens = np.take_along_axis(cand, best, 1), np.take_along_axis(ids, best, 1)
    order = np.lexsort((tokens, -vals), axis=1)  # by logit, ties by token id
    vals, tokens = np.take_along_axis(vals, order, 1), np.take_along_axis(tokens, order, 1)
    top = vals[:, :1].astype(np.float64)
    mass = np.exp(col_max - top).sum(axis=1) + np.exp(tail - top).sum(axis=1)  # ≤ the row's Σ exp(logit − top)
    return tokens.astype(np.int64), (vals - top - np.log(mass)[:, None]).astype(np.float32)


class TokenRecycler(Drafter):
    """Drafter protocol with no model: BFS over the target's recycled candidates."""

    def __init__(self, n_vocab: int, top_k: int = TOP_K, learn_rows: int = LEARN_ROWS):
        self.n_vocab = n_vocab
        self.top_k = top_k
        self.learn_rows = learn_rows
        self.next_tokens: np.ndarray | None = None  # (vocab, top_k) int32, -1: nothing stored
        self.next_logp: np.ndarray | None = None  # (vocab, top_k) float16

    def forget(self) -> None:
        self.next_tokens = self.next_logp = None

    @property
    def nbytes(self) -> int:
        return 0 if self.next_tokens is None else self.next_tokens.nbytes + self.next_logp.nbytes

    def learn(self, tree: DraftTree, logits: np.ndarray, path: Sequence[int]) -> None:
        """Store the target's top-k after the nodes of a verified tree (logits: (len(tree), vocab))."""
        on_path = {int(i) for i in path}
        others = [i for i in range(len(tree)) if i not in on_path]
        rows = (others[: max(0, self.learn_rows - len(on_path))] + [int(i) for i in path])[-self.learn_rows :]
        if self.next_tokens is None:
            vocab = max(self.n_vocab, logits.shape[1])
            self.next_tokens = np.full((vocab, self.top_k), -1, dtype=TOKEN_TYPE)
            self.next_logp = np.zeros((vocab, self.top_k), dtype=LOGP_TYPE)
        ascending = sorted(rows)
        contiguous = ascending[-1] - ascending[0] + 1 == len(ascending)  # then a view: no copy of the rows
        tokens, logp = top_k_rows(logits[ascending[0] : ascending[-1] + 1] if contiguous else logits[ascending], self.top_k)
        at = {row: i for i, row in enumerate(ascending)}
        order = [at[row] for row in rows]  # repeated tokens: the last row wins (the path's)
        k = tokens.shape[1]
        self.next_tokens[tree.tokens[rows], :k] = tokens[order]
        self.next_logp[tree.tokens[rows], :k] = logp[order]

    def candidates(self, token: int) -> tuple[np.ndarray, np.ndarray]:
        """What the target ranked after `token` last time: (ids, log-probs), best first."""
        if self.next_tokens is None or not 0 <= token < len(self.next_tokens):
            return np.zeros(0, np.int32), np.zeros(0, np.float16)
        ids = self.next_tokens[token]
        known = ids >= 0
        return ids[known], self.next_logp[token][known]

    def draft(self, context: Sequence[int], spec: DraftSpec) -> DraftTree:
        if len(context) == 0:
            raise OndeviceError("token recycling needs a non-empty context.")
        if spec.budget < 0:
            raise OndeviceError(f"the draft budget must be >= 0, not {spec.budget}.")
        tree = self.propose(int(context[-1]), spec.budget, spec.max_depth)
        return for_rule(tree, spec.sample_children, spec.temperature, self.n_vocab)

    def propose(self, root: int, budget: int, max_depth: int | None = None) -> DraftTree:
        """The `budget` best nodes of the breadth-first search from `root` over the adjacency."""
        tokens, parents, logprobs = [root], [-1], [0.0]
        heap: list[tuple[float, int, int, int, int]] = []  # (-score, tie, token, out parent, depth)
        tie = itertools.count()

        def push_children(out: int, depth: int) -> None:
            if max_depth is not None and depth >= max_depth:
                return
            ids, logp = self.candidates(tokens[out])
            for token, step in zip(ids.tolist(), logp.tolist()):
                heapq.heappush(heap, (-(logprobs[out] + min(step, -1e-6)), next(tie), token, out, depth + 1))

        push_children(0, 0)
        while heap and len(tokens) <= budget:
            neg_score, _, token, out_parent, depth = heapq.heappop(heap)
            tokens.append(token)
            parents.append(out_parent)
            logprobs.append(-neg_score)
            push_children(len(tokens) - 1, depth)
        return DraftTree(np.array(tokens), np.array(parents), np.array(logprobs))
