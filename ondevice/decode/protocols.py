"""The narrow interfaces the engine knows. Backends live in draft/ and targets/, are chosen in
`ondevice.loading` (one place: `loading/choices.plan_load`) and opened by targets/loader.py and draft/loader.py.

Data flows one way: tokens → Drafter.draft → DraftTree → Target.forward_tree → logits →
verify → Target.commit(path) → tokens out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from ondevice.decode.tree import DraftTree


class Target(Protocol):
    """The big model. Holds a KV cache of committed tokens; verifies a whole tree in one pass."""

    n_vocab: int
    n_ctx: int

    @property
    def n_cached(self) -> int:
        """Number of committed tokens in the KV cache."""
        ...

    def truncate(self, n_tokens: int) -> None:
        """Keep only the first n_tokens of the cache (e.g. a new chat turn that shares a prefix)."""
        ...

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append tokens to the cache (chunked as the backend likes); no logits are returned."""
        ...

    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        """One pass over all tree nodes at positions n_cached + depth, with the tree mask.

        Returns (len(tree), n_vocab) float32 logits: row i is the target's prediction after node i.
        The nodes sit provisionally in the cache until `commit`.
        """
        ...

    def commit(self, path: Sequence[int]) -> None:
        """Keep the cache entries of these tree nodes (a root-first path, path[0] == 0), drop the rest."""
        ...

    # The hooks below have defaults: a backend subclasses this Protocol and overrides the ones it has.

    def stream_counters(self) -> StreamCounters | None:
        """Running totals of a target that streams its weights from disk (targets/llama_target.py
        with a page-cache window); the engine reports their growth per answer. None: it does not stream."""
        return None

    def close(self) -> None:
        """Free the model now (contexts, threads), not at garbage collection."""


@dataclass(frozen=True)
class StreamCounters:
    """Running totals of a streaming target since it was opened (None: not measured here)."""

    page_wait_seconds: float | None  # its passes waited this long for pages from the disk
    disk_busy_seconds: float | None  # its file's block device had a read in flight this long (machine/disk_io.py)


MAX_BUDGET = 2048  # the most drafted nodes per target pass any drafter or --budget accepts

# trees grown by the drafter model; hybrid: its best-first search grown from the free sources' proposals
MODEL_BUILDERS = ("chain", "best-first", "multi-seq", "hybrid")
# no model: prompt lookup (draft/lookup.py), the session's suffix automaton (draft/suffix_drafter.py),
# the target's recycled candidates (draft/recycle.py)
FREE_BUILDERS = ("lookup", "suffix", "recycle")
BUILDERS = MODEL_BUILDERS + FREE_BUILDERS
# the planner's rounds of the target alone: the free sources' merged tree, sized to the pass (never a --tree)
TARGET_FREE = "free"
# drafted nodes per pass when --budget is not given; free trees: passes of <= 7 tokens (cheap on a CPU
# target); hybrid: best-first's budget (the free nodes take part of it)
DEFAULT_BUDGET = {"chain": 4, "best-first": 16, "multi-seq": 8, "hybrid": 16, "lookup": 6, "suffix": 6, "recycle": 6}
FREE_TREE_NODES = max(DEFAULT_BUDGET[b] for b in FREE_BUILDERS) + 1  # a free drafter's default tree, with its root


@dataclass(frozen=True)
class DraftSpec:
    """How to draft one round."""

    builder: str = "chain"  # one of BUILDERS
    budget: int = 8  # drafted nodes (root excluded)
    temperature: float = 0.0  # > 0: record tempered draft probs q in tree.q (sampling verification)
    sample_children: bool = False  # draw children without replacement from q (Sequoia's rule) instead of top-k
    seed: int = 0
    max_depth: int | None = None  # best-first: no node deeper than this (the planner's depth); None: unbounded
    # a free round sized to its pass (the planner's): the target's pass seconds over 1, 2, … budget + 1
    # tokens; the tree is cut to the size whose expected tokens pay best for them (draft/sizing.py).
    # None: the whole budget
    pass_seconds: tuple[float, ...] | None = None


def config_label(spec: DraftSpec | None) -> str:
    """How a round was drafted, as bench rows and stats lines name it: "target", "target+free" (the
    target alone's round with the free drafts that pay for its pass), or "<builder>@<budget>"."""
    if spec is None or spec.budget <= 0:
        return "target"
    return "target+free" if spec.builder == TARGET_FREE else f"{spec.builder}@{spec.budget}"


class Drafter(Protocol):
    """The small model on the CPU. Stateless to the caller: it syncs its own cache to `context`."""

    n_vocab: int

    def draft(self, context: Sequence[int], spec: DraftSpec) -> DraftTree:
        """Propose a tree rooted at context[-1] with at most `spec.budget` drafted nodes (root excluded).

        `context` is every committed token so far; the drafter keeps what it already has cached
        of it (longest common prefix) and rolls back the rest.
        """
        ...

    # The hooks below have defaults: a drafter subclasses this Protocol and overrides the ones it has.

    carried_fraction: float = 0.0  # the last draft: share of its tree grown during the previous target pass

    def learn(self, tree: DraftTree, logits: np.ndarray, path: Sequence[int]) -> None:
        """Called after every verification with the target's (len(tree), n_vocab) logits and the
        accepted path (draft/recycle.py keeps the target's top-k)."""

    def grows(self, spec: DraftSpec) -> bool:
        """Whether this round's search goes on growing while the target verifies (a top-k best-first
        search, decode/overlap.py carries it)."""
        return False

    def grow(self, should_stop: Callable[[], bool]) -> int:
        """Go on growing the search `draft` began until should_stop() (where `grows`); returns the
        nodes expanded."""
        return 0

    def close(self) -> None:
        """Free the model now (contexts, threads), not at garbage collection."""
