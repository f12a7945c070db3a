"""What every drafter *model* does the same way, whatever runs it (llama.cpp, ONNX Runtime).

A backend supplies `cache`: its KV cache of the context plus the round's tree (`sync(context)` →
the root's logits; `expand`, `free_capacity`, `release` as `builders.Expander`; `tokens`, what it
holds of the context). `ModelDrafter.draft` then checks the spec, syncs, and grows the tree with
the builder the spec names; `probe_batch` times one expansion call for the profile.

`grow(should_stop)` runs while the target verifies the tree a best-first round returned (SpecExec's
way of using the target's time): it expands the best unexpanded nodes of that round's search, in
small batches, until told to stop or the planned tree size is reached. The node the target ends on
(its bonus token) is then often an expanded node, and the next round starts from the search
re-rooted there (`DraftKV.sync(context, carry_k)`). Only top-k (not sampled) searches are carried:
the tree of a round is still chosen from the drafter's distributions alone, so every verification
rule stays exact.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ondevice.draft.builders import BATCH_SPREAD, LEAF_MARGIN, Round, build_best_first, build_chain, build_multi_seq
from ondevice.draft.hybrid import build_hybrid
from ondevice.draft.search_tree import SearchTree
from ondevice.errors import OndeviceError
from ondevice.decode.protocols import MAX_BUDGET, MODEL_BUILDERS, Drafter, DraftSpec
from ondevice.decode.tree import DraftTree

PROBE_CHILDREN = 16  # children the profile's probe ranks for each row, as a best-first search of 16 nodes does
GROW_BATCH = 1  # nodes per expansion while the target verifies: one, so the search stops soon after the pass


def stand_in_tokens(n: int, n_vocab: int) -> np.ndarray:
    """n arbitrary valid token ids, the same every time: text for passes that are timed or warm buffers."""
    return (np.arange(n) * 7919 + 11) % n_vocab


def check_spec(spec: DraftSpec) -> None:
    if spec.builder not in MODEL_BUILDERS:
        raise OndeviceError(f"the drafter model builds {', '.join(MODEL_BUILDERS)} trees, not {spec.builder!r}.")
    if not 1 <= spec.budget <= MAX_BUDGET:
        raise OndeviceError(f"the draft budget must be 1 to {MAX_BUDGET} tokens, not {spec.budget}.")
    if spec.max_depth is not None and spec.max_depth < 1:
        raise OndeviceError(f"the draft depth must be at least 1, not {spec.max_depth}.")
    if not spec.temperature >= 0:
        raise OndeviceError(f"the temperature must be >= 0, not {spec.temperature}.")


def carries_search(spec: DraftSpec) -> bool:
    """A top-k best-first search (not children sampled for Sequoia) can be carried to the next round."""
    return spec.builder == "best-first" and not (spec.sample_children and spec.temperature > 0)


class ModelDrafter(Drafter):
    """The Drafter protocol over a backend's `cache`; subclasses set cache, n_ctx, n_vocab, max_batch
    (and call `limit_vocab` when the target's vocabulary is shorter)."""

    cache = None
    expander = None  # the cache, or BlockedTokens over it
    n_ctx: int
    n_vocab: int
    max_batch: int
    max_tree: int = MAX_BUDGET  # the biggest tree its buffers are sized for (the memory plan)
    batch_spread: float = BATCH_SPREAD
    leaf_margin: float = LEAF_MARGIN  # best-first leaves nodes this close to the weakest kept one unexpanded
    last_round: Round | None = None  # the last best-first round, whose search `grow` extends
    carried_fraction = 0.0  # the last draft: share of its tree's expansions carried from the last search

    def limit_vocab(self, target_vocab: int | None) -> None:
        """target_vocab: the target's vocabulary size when the two differ by padding (tokenizer.vocab_mismatch):
        ids the target lacks are never drafted, and a context holding an id the drafter lacks gets no draft."""
        short = target_vocab is not None and target_vocab < self.n_vocab
        self.expander = BlockedTokens(self.cache, np.arange(target_vocab, self.n_vocab)) if short else self.cache

    def draft(self, context: Sequence[int], spec: DraftSpec, free: DraftTree | None = None) -> DraftTree:
        """free: the free sources' proposals a hybrid tree starts from (draft/hybrid.py; None: none)."""
        check_spec(spec)
        if spec.budget > self.max_tree:
            raise OndeviceError(
                f"this drafter is sized for trees of up to {self.max_tree} nodes (the memory plan), "
                f"not {spec.budget}; lower --budget."
            )
        if not 0 < len(context) <= self.n_ctx:
            raise OndeviceError(
                f"the drafter holds 1 to {self.n_ctx} context tokens, got {len(context)}; "
                "start a new chat or raise the context size."
            )
        self.last_round, self.carried_fraction = None, 0.0
        if max(context) >= self.n_vocab:  # the target committed an id the drafter has no row for
            return free if spec.builder == "hybrid" and free is not None else DraftTree.root_only(int(context[-1]))
        top_k = carries_search(spec)
        root_logits = self.cache.sync(context, min(spec.budget, self.n_vocab) if top_k else 0)
        if root_logits is None:  # the last search, re-rooted here: its root is expanded already
            r = self.last_round = Round(spec, int(context[-1]), self.expander, position=len(context), tree=self.cache.carried)
            carried = {n for n, done in enumerate(r.tree.expanded) if done}
            tree = build_best_first(r, None, self.max_batch, self.batch_spread, self.leaf_margin)
            used = len(carried & {0, *r.tree.best(spec.budget, spec.max_depth)})
            self.carried_fraction = used / (used + r.expansions)
            return tree
        if self.expander is not self.cache:
            root_logits = self.expander.mask(root_logits)
        r = Round(spec, int(context[-1]), self.expander, position=len(context))
        root_logp = r.distributions([0], root_logits[None, :])[0]
        if spec.builder == "chain":
            return build_chain(r, root_logp)
        if spec.builder == "multi-seq":
            return build_multi_seq(r, root_logp)
        if spec.builder == "hybrid" and not r.sampled:  # Sequoia's sampled children: the model's tree alone
            return build_hybrid(r, root_logp, free or DraftTree.root_only(int(context[-1])), self.max_batch, self.batch_spread, self.leaf_margin)
        self.last_round = r if top_k else None
        return build_best_first(r, root_logp, self.max_batch, self.batch_spread, self.leaf_margin)

    def grows(self, spec: DraftSpec) -> bool:
        """Whether `grow` can extend this spec's search (and the next round carry it)."""
        return carries_search(spec) and getattr(self.cache, "carries", False)

    def grow(self, should_stop: Callable[[], bool]) -> int:
        """Expand the best unexpanded nodes of the last best-first search until should_stop() or the
        planned tree size (memory plan) is reached; returns how many were expanded. Meant to run
        while the target verifies the tree that search gave (see the module docstring)."""
        r = self.last_round
        if r is None or not getattr(self.cache, "carries", False):
            return 0
        # One thread: llama.cpp's OpenMP team is per calling thread, and with more OpenMP threads than
        # cores libgomp cuts every team's spinning short, which slows every decode of the process
        # (docs/measurements/2026-11-23-streaming-1.3gb.md).
        ctx = self.cache.ctx
        ctx.set_threads(1)
        grown = 0
        try:
            while not should_stop():
                alive = self.cache.expanded()
                room = min(GROW_BATCH, self.expander.free_capacity(), self.max_tree - len(alive))
                frontier = r.tree.unexpanded(room, alive) if room > 0 else []
                if not frontier:
                    break
                for node, logp in zip(frontier, r.expand(frontier)):
                    r.add(node, logp, r.tree.k)  # all k children: the next round may be rooted anywhere
                grown += len(frontier)
        finally:
            ctx.set_threads(ctx.threads)
        return grown

    def probe_batch(self, n: int) -> None:
        """Draft n nodes as the builders would (siblings, each on its own branch; more than max_batch,
        or than the cache has branches for, take several expansion calls), then undo it. For profiling:
        a call is timed with the search's work on its rows, which the cost model prices with it."""
        stand_in = stand_in_tokens(64 + n, self.n_vocab)
        if not self.cache.tokens:
            self.cache.sync(stand_in[:64].tolist())  # a 64-token context
        step = max(1, min(self.max_batch, self.cache.free_capacity()))  # sized for small trees: fewer branches at once
        for start in range(0, n, step):
            search = SearchTree(self.cache.tokens[-1])
            batch = stand_in[64 + start : 64 + min(n, start + step)]
            nodes = search.add_children(0, batch, np.zeros(len(batch)))
            r = Round(DraftSpec("best-first", PROBE_CHILDREN), search.tokens[0], self.expander, tree=search)
            for node, logp in zip(nodes, r.expand(nodes)):  # and what the search does with each row: its
                r.add(node, logp, PROBE_CHILDREN)  # log-probs over the vocabulary, its top children
            self.cache.release(search, {0})


class BlockedTokens:
    """A drafter's KV cache as an Expander whose logits are -inf at the `blocked` token ids: a drafter
    with a longer (padded) vocabulary than the target's never proposes an id the target lacks, one
    of another vocabulary only the tokens the two share (draft/cross_vocab.py)."""

    def __init__(self, cache, blocked: np.ndarray):
        """blocked: the drafter's token ids never to draft (an index array)."""
        self.cache = cache
        self.columns = cache.columns
        if self.columns is not None:  # the columns standing for blocked ids
            blocked = np.flatnonzero(np.isin(self.columns.keep_ids, blocked))
        self.blocked = np.asarray(blocked, dtype=np.int64)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        logits = np.array(logits, dtype=np.float32, copy=True)
        logits[..., self.blocked] = -np.inf
        return logits

    def expand(self, tree: SearchTree, nodes: Sequence[int]) -> np.ndarray:
        return self.mask(self.cache.expand(tree, nodes))

    def free_capacity(self) -> int:
        return self.cache.free_capacity()

    def release(self, tree: SearchTree, alive: set[int]) -> None:
        self.cache.release(tree, alive)
