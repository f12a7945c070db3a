"""The ONNX drafter's KV cache: the context on slots 0..len(tokens)−1, the round's tree after it.

Unlike llama.cpp's sequences, the ONNX decoder takes an explicit mask, so a tree needs no
bookkeeping beyond which slot each expanded node's entry went to: expanding nodes gives each the
next free slot (in one decoder call), with a mask row over the context plus its ancestors' slots
and its own. Slots of pruned nodes are not reused within a round; the round's slots are all free
again at the next `sync`, which first moves the accepted nodes' entries down onto the context
(accepted nodes are never decoded twice), then decodes whatever else of the context is new.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ondevice.draft.search_tree import SearchTree
from ondevice.decode.kvcache import CachedContext, kept_prefix
from ondevice.onnx.decoder import OnnxDecoder, causal_mask

SYNC_CHUNK = 256  # context tokens per decoder call


class OnnxDraftKV(CachedContext):
    """builders.Expander over an OnnxDecoder. columns: what the head's logits columns stand for (a
    VocabTrim head), or None (the whole vocabulary)."""

    def __init__(self, decoder: OnnxDecoder, columns=None):
        super().__init__()  # tokens: the context held on slots 0..len − 1
        self.decoder = decoder
        self.columns = columns
        self.slot_of: dict[int, int] = {}  # expanded node -> its slot
        self.used = 0  # slots in use (context + this round's expanded nodes)

    def free_capacity(self) -> int:
        return self.decoder.slots - self.used

    # --- sync -----------------------------------------------------------------------------------
    carries = False  # a search is not carried over rounds (its slots would move): carry_k is ignored
    carried = None

    def sync(self, context: Sequence[int], carry_k: int = 0) -> np.ndarray:
        """Hold `context` and return the logits (columns,) after its last token."""
        context = [int(t) for t in context]
        self._keep_accepted_nodes(context)
        n_keep = kept_prefix(self.tokens, context)
        del self.tokens[n_keep:]
        self.tree, self.slot_of, self.used = None, {}, n_keep
        self.last_sync_decoded = len(context) - n_keep
        new = context[n_keep:]
        for i in range(0, len(new), SYNC_CHUNK):
            chunk, start = new[i : i + SYNC_CHUNK], len(self.tokens)
            hidden = self.decoder.hidden(chunk, np.arange(start, start + len(chunk)), start, causal_mask(start, len(chunk)))
            self.tokens += chunk
        self.used = len(self.tokens)
        return self.decoder.logits(hidden[-1:])[0]

    def _keep_accepted_nodes(self, context: list[int]) -> None:
        """Move the entries of the last tree's nodes that `context` continues with onto the context."""
        kept = self.accepted_nodes(context, self.slot_of)
        if kept:
            self.decoder.move(np.array([self.slot_of[n] for n in kept]), len(self.tokens))
            self.tokens += [self.tree.tokens[n] for n in kept]

    def reset(self) -> None:
        self.tokens, self.tree, self.slot_of, self.used = [], None, {}, 0

    # --- expansion ----------------------------------------------------------------------------
    def expand(self, tree: SearchTree, nodes: Sequence[int]) -> np.ndarray:
        """Decode these nodes in one call (each parent expanded already or earlier in `nodes`): (len(nodes), columns) logits."""
        self.tree = tree
        n, start = len(nodes), self.used
        if n > self.free_capacity():
            raise RuntimeError("not enough free cache slots for this batch (check free_capacity)")
        mask = np.zeros((n, start + n), dtype=bool)
        mask[:, : len(self.tokens)] = True  # the context, root included
        slot_of = {**self.slot_of, **{node: start + row for row, node in enumerate(nodes)}}  # a parent may be in this call
        for row, node in enumerate(nodes):
            mask[row, start + row] = True
            parent = tree.parents[node]
            while parent > 0:
                mask[row, slot_of[parent]] = True
                parent = tree.parents[parent]
        positions = np.array([self.root_pos + tree.depths[node] for node in nodes])
        hidden = self.decoder.hidden([tree.tokens[node] for node in nodes], positions, start, mask)
        self.slot_of = slot_of
        self.used += n
        return self.decoder.logits(hidden)

    def release(self, tree: SearchTree, alive: set[int]) -> None:
        """Slots are freed a round at a time; only when nothing but the root is alive are they free now."""
        if not (alive - {0}):
            self.slot_of, self.used = {}, len(self.tokens)
