"""The drafter's KV cache: committed context on sequence 0, draft-tree branches on path sequences.

llama.cpp's unified KV cache lets one cell belong to many sequences, and a token attends to the
cells of its first sequence id at positions up to its own. So a branch of the draft tree is a
*path sequence*: a sequence id whose cells are the context plus one root→node path. Expanding a node
(decoding its token to get its children's distribution) puts its cell on a path sequence:

- the parent ends a path sequence  → the child extends that sequence (no new id);
- otherwise (a second child, or the parent is the root) → a fresh id gets the parent's path by
  `seq_cp(parent_seq, new, 0, pos(parent) + 1)`, which only adds the id to existing cells.

Many nodes of one batch go to one `llama_decode`. When the builder prunes nodes, `release` trims
their path sequences (cells no sequence holds are freed, ids return to the pool). On the next
`sync(context)` the cache keeps the longest common prefix, including the nodes of the last tree that
the context went on with (their cells move onto sequence 0: accepted nodes are never re-decoded).

`sync(context, carry_k)` goes further when the whole new part of the context, its last token
included, spells expanded nodes of the last search (the target accepted a path and its bonus token
is a node the drafter expanded, e.g. while the target verified, `ModelDrafter.grow`): the search is
re-rooted there (`carried`) and the path sequences below the new root keep their cells — they
already hold the new context plus their path, at the right positions — so nothing is decoded again.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ondevice.draft.search_tree import SearchTree
from ondevice.decode.kvcache import CachedContext, kept_prefix
from ondevice.llama_backend import LlamaContext

MAIN_SEQ = 0


class DraftKV(CachedContext):
    """builders.Expander over a llama.cpp context. columns: what its logits' columns stand for (a
    VocabTrim head over a TrimmedContext), or None (the whole vocabulary)."""

    carries = True  # sync can carry the last search over to the next round

    def __init__(self, ctx: LlamaContext, columns=None):
        super().__init__()  # tokens: what sequence 0 holds
        self.ctx = ctx
        self.columns = columns
        self.carried: SearchTree | None = None  # the last sync's re-rooted search, if it carried one
        self.path_end: dict[int, int] = {}  # path sequence id -> the node its path ends at
        self.node_seq: dict[int, int] = {}  # node with a KV cell -> one path sequence holding it
        self.free_seqs: list[int] = []  # unused sequence ids
        self._forget_branches()

    def free_capacity(self) -> int:
        """How many more nodes can surely be expanded (each may need a fresh sequence id)."""
        return len(self.free_seqs)

    # --- sync ---------------------------------------------------------------------------------
    def sync(self, context: Sequence[int], carry_k: int = 0) -> np.ndarray | None:
        """Make sequence 0 hold `context` and return the root's (context[-1]'s) logits row (a view);
        None when carry_k > 0 and the last search, built with top-`carry_k` children, is carried
        (re-rooted at context[-1]: `self.carried`)."""
        context = [int(t) for t in context]
        self.carried = None
        try:
            if carry_k and self._carry(context, carry_k):
                return None
            self._keep_accepted_nodes(context)
            self._drop_branches()
            n_keep = kept_prefix(self.tokens, context)
            self.ctx.seq_rm(MAIN_SEQ, n_keep, -1)
            del self.tokens[n_keep:]
            self.last_sync_decoded = len(context) - n_keep
            return self._append(context[n_keep:])
        except BaseException:
            self.reset()
            raise

    def _keep_accepted_nodes(self, context: list[int]) -> None:
        """Move the cells of the last tree's nodes that `context` continues with onto sequence 0."""
        kept = self.accepted_nodes(context, self.node_seq)
        if kept:
            start = len(self.tokens)
            self.ctx.seq_cp(self.node_seq[kept[-1]], MAIN_SEQ, start, start + len(kept))
            self.tokens.extend(self.tree.tokens[n] for n in kept)

    def _carry(self, context: list[int], k: int) -> bool:
        """Re-root the last search at context[-1] if the new tokens are all expanded nodes of it."""
        tree = self.tree
        if tree is None or tree.k != k or len(context) <= len(self.tokens) or not self.goes_on(context):
            return False
        path = tree.follow(self.node_seq, context[len(self.tokens) :])
        if len(path) != len(context) - len(self.tokens):
            return False
        root, start = path[-1], len(self.tokens)
        self.ctx.seq_cp(self.node_seq[root], MAIN_SEQ, start, start + len(path))
        self.tokens.extend(context[start:])
        carried, new_id = tree.subtree(root, set(self.node_seq))
        path_end = {}
        for seq, end in self.path_end.items():  # a path ending at or above the new root is on sequence 0 now
            if end != root and end in new_id:
                path_end[seq] = new_id[end]
            else:
                self.ctx.seq_rm(seq, -1, -1)
        self.path_end = path_end
        self.node_seq = {new_id[n]: seq for n, seq in self.node_seq.items() if n in new_id and n != root}
        self.free_seqs = [s for s in range(self.ctx.n_seq_max - 1, MAIN_SEQ, -1) if s not in path_end]
        self.tree = self.carried = carried
        self.last_sync_decoded = 0
        return True

    def expanded(self) -> set[int]:
        """The root and the nodes of the current search whose KV cells are cached."""
        return {0, *self.node_seq}

    def _drop_branches(self) -> None:
        for seq in self.path_end:
            self.ctx.seq_rm(seq, -1, -1)
        self._forget_branches()

    def _forget_branches(self) -> None:
        self.path_end, self.node_seq, self.tree, self.carried = {}, {}, None, None
        self.free_seqs = list(range(self.ctx.n_seq_max - 1, MAIN_SEQ, -1))

    def _append(self, tokens: list[int]) -> np.ndarray:
        """Decode tokens onto sequence 0 in batches; the logits of the last one."""
        step = self.ctx.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            pos = len(self.tokens) + np.arange(len(chunk))
            is_last = start + step >= len(tokens)
            outputs = np.zeros(len(chunk), bool)
            outputs[-1] = is_last
            logits = self.ctx.decode(chunk, pos, np.zeros(len(chunk), np.int32), outputs)
            self.tokens.extend(chunk)
        return logits[0]

    def reset(self) -> None:
        """Forget everything (after an error the cache contents are unknown)."""
        self.ctx.clear()
        self.tokens = []
        self._forget_branches()

    # --- expansion ----------------------------------------------------------------------------
    def expand(self, tree: SearchTree, nodes: Sequence[int]) -> np.ndarray:
        """Decode these nodes of `tree` in one llama_decode: each parent expanded already, or earlier in
        `nodes` with no other child there (the child then extends the parent's path sequence).

        Returns their (len(nodes), columns) logits as a view, valid until the next decode.
        """
        self.tree = tree
        if len(nodes) > len(self.free_seqs):
            raise RuntimeError("not enough free sequence ids for this batch (check free_capacity)")
        seqs = [self._place(tree, n) for n in nodes]
        positions = [self.root_pos + tree.depths[n] for n in nodes]
        tokens = [tree.tokens[n] for n in nodes]
        try:
            return self.ctx.decode(tokens, positions, np.asarray(seqs, np.int32), np.ones(len(nodes), bool))
        except BaseException:
            self.reset()
            raise

    def _place(self, tree: SearchTree, node: int) -> int:
        """Choose the path sequence of a node about to be decoded, creating it if needed."""
        parent = tree.parents[node]
        if parent == 0:
            seq = self.free_seqs.pop()
            self.ctx.seq_cp(MAIN_SEQ, seq, -1, -1)  # the context, root included
        else:
            parent_seq = self.node_seq[parent]
            if self.path_end[parent_seq] == parent:
                seq = parent_seq
            else:
                seq = self.free_seqs.pop()
                self.ctx.seq_cp(parent_seq, seq, -1, self.root_pos + tree.depths[parent] + 1)
        self.path_end[seq] = node
        self.node_seq[node] = seq
        return seq

    # --- pruning ------------------------------------------------------------------------------
    def release(self, tree: SearchTree, alive: set[int]) -> None:
        """Free the cells of expanded nodes outside `alive` (an ancestor-closed set) and unused ids.

        Each path sequence is cut back to its deepest alive node; a sequence whose new end lies on
        another sequence's path (or is the root) is redundant and goes entirely.
        """
        new_end = {}
        for seq, end in self.path_end.items():
            while end != 0 and end not in alive:
                end = tree.parents[end]
            new_end[seq] = end
        inner = set()  # nodes strictly above some path's end
        for end in set(new_end.values()):
            inner.update(tree.path(end)[:-1])
        ends_taken = set()
        for seq, end in new_end.items():
            if end == 0 or end in inner or end in ends_taken:
                self.ctx.seq_rm(seq, -1, -1)
                del self.path_end[seq]
                self.free_seqs.append(seq)
            else:
                ends_taken.add(end)
                if end != self.path_end[seq]:
                    self.ctx.seq_rm(seq, self.root_pos + tree.depths[end] + 1, -1)
                    self.path_end[seq] = end
        self.node_seq = {}
        for seq, end in self.path_end.items():
            for node in tree.path(end)[1:]:
                self.node_seq.setdefault(node, seq)
