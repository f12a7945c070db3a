"""KV-cache bookkeeping that every cache shares, whatever holds the keys and values.

A cache holds committed tokens on slots 0..n−1 (slot i = position i) and, after them, the nodes of
a draft tree at provisional slots. When a path of the tree is accepted its entries move down to
n, n+1, ... and are never computed again; whatever lies beyond the new length is garbage to be
overwritten. The storage differs (torch buffers, numpy arrays bound to ONNX Runtime, llama.cpp
cells on sequences), the bookkeeping does not:

- `move_entries`: accepted entries copied down within each layer's arrays (torch or numpy);
- `TreeSlots`: a target's length, its room, and the last verified tree whose path `commit` keeps;
- `CachedContext`: a drafter's context, what a new context keeps of it, and which nodes of the
  last tree it goes on with.
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.decode.tree import common_prefix

NO_TREE = np.zeros(0, dtype=np.int64)


def move_entries(caches, src_slots, dst_start: int) -> None:
    """In every (B, heads, slots, hd) array, copy the entries at src_slots to dst_start, dst_start+1, ...

    The gather copies first, so sources and destinations may overlap. Torch tensors and numpy arrays alike.
    """
    end = dst_start + len(src_slots)
    for cache in caches:
        cache[:, :, dst_start:end] = cache[:, :, src_slots]


def kept_prefix(cached: Sequence[int], context: Sequence[int]) -> int:
    """How much of `cached` a cache keeps to hold `context`: their common prefix, but never the last
    token of `context`, which must be decoded again to give the logits after it."""
    return min(common_prefix(cached, context), len(context) - 1)


def is_root_path(parents: np.ndarray, path: np.ndarray) -> bool:
    """Whether `path` is a root-first path (path[0] == 0) of the tree with these parents."""
    if len(path) == 0 or path[0] != 0 or len(parents) == 0 or np.any(path >= len(parents)):
        return False
    return bool(np.all(parents[path[1:]] == path[:-1]))


class TreeSlots:
    """A target's slots: 0..n_cached hold committed tokens; the last verified tree's node i sits at
    slot n_cached + i until `commit(path)` keeps one root-first path of it."""

    def __init__(self, n_ctx: int):
        self.n_ctx = n_ctx
        self.n_cached = 0
        self.tree_parents = NO_TREE  # the last tree, whose nodes sit after n_cached

    def check_room(self, n_new: int) -> None:
        if self.n_cached + n_new > self.n_ctx:
            raise OndeviceError(
                f"{self.n_cached + n_new} tokens do not fit the context of {self.n_ctx}: shorten the prompt or start with a larger n_ctx."
            )

    def truncate(self, n_tokens: int) -> None:
        if not 0 <= n_tokens <= self.n_cached:
            raise ValueError(f"cannot truncate a cache of {self.n_cached} tokens to {n_tokens}")
        self.n_cached, self.tree_parents = n_tokens, NO_TREE

    def appended(self, n_tokens: int) -> None:
        """n_tokens more were written at slots n_cached.. (a prefill chunk): they are committed."""
        self.n_cached, self.tree_parents = self.n_cached + n_tokens, NO_TREE

    def tree_written(self, parents: np.ndarray) -> None:
        """A tree with these parents was written at slots n_cached + node."""
        self.tree_parents = parents

    def commit(self, path: Sequence[int], move: Callable[[np.ndarray, int], None]) -> None:
        """Keep a root-first path of the last tree: `move(src_slots, dst_start)` copies its entries down."""
        path = np.asarray(path, dtype=np.int64)
        if not is_root_path(self.tree_parents, path):
            raise ValueError(f"commit needs a root-first path of the last tree's nodes, got {path.tolist()}")
        move(self.n_cached + path, self.n_cached)
        self.appended(len(path))


class CachedContext:
    """A drafter's cache: `tokens[i]` at position i, the root (the last token) at `root_pos`, and the
    tree grown since the last sync, whose expanded nodes hold cache entries (`cells`: node -> where)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.tree = None  # the SearchTree grown since the last sync
        self.last_sync_decoded = 0  # tokens the last sync had to decode (the rest was cached)

    @property
    def root_pos(self) -> int:
        return len(self.tokens) - 1

    def goes_on(self, context: Sequence[int]) -> bool:
        """Whether `context` starts with everything cached."""
        return common_prefix(self.tokens, context) == len(self.tokens)

    def accepted_nodes(self, context: Sequence[int], cells: Collection[int]) -> list[int]:
        """The last tree's nodes among `cells` that `context` goes on with, root-first (its last token
        excepted: it must be decoded to give the logits after it). Empty when `context` left the cache."""
        if self.tree is None or not self.goes_on(context):
            return []
        return self.tree.follow(cells, context[len(self.tokens) : len(context) - 1])
