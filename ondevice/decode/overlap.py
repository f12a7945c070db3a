"""DuoDecoding-style overlap: the drafter drafts round r+1 while the target verifies round r.

The target's pass over tree T runs in a worker thread (llama.cpp calls through ctypes and torch
ops release the GIL); meanwhile the drafter, on this thread, assumes the most likely outcome: the
target accepts the drafter's top-1 path through T (at each node the child with the highest draft
log-prob, down to a leaf). It drafts the next tree from context + that path, rooted at the leaf.
If the target then accepts exactly that path and its bonus token is a child of the prepared root,
the prepared tree re-rooted at that child (`DraftTree.subtree`) is the next round's tree and the
drafter has nothing left to do; otherwise the engine drafts afresh (the drafter rolls its cache
back to the real context by longest common prefix, so a wrong guess costs only time).

The prepared tree is drafted with one node more than the next round may verify: re-rooting drops
the root's level, so a chain of budget b + 1 leaves exactly the chain of b a fresh draft would make.
Other shapes keep only the nodes below the bonus token, fewer than a fresh tree of b (a round that
is a hit verifies a smaller tree but skips drafting). A root-only T guesses the empty path, which
always comes true: the prepared tree is then a fresh draft made while the target ran.

**Why this stays exact.** Each rule in `ondevice.decode.verify` is exact under its own condition on the
tree (greedy, SpecExec: any tree; Sequoia: children drawn from q), provided the tree is chosen from
what is known before the round's target draws and the drafter's randomness (its own seeded
generator) is independent of the target's (the engine's `rng`). The prepared tree is a function of
the context, T and the drafter's seed only — it is drafted before T's verdict exists — and whether
it is used depends on T's verdict, which is the past by the time the next round draws anything. So:

- greedy: the emitted tokens are the target's argmax whatever the tree (token-for-token the same,
  up to the target's batch noise, as with overlap off or the target alone);
- SpecExec: every emitted token is one draw x ~ P(node) from the engine's rng, one draw per emitted
  token whatever the tree, so the tokens are even the same as without overlap for the same seed;
- Sequoia: needs each node's children to be a draw-order prefix of draws without replacement from
  q[node], with q[node] the drafter's distribution at that node. The subtree keeps every kept child
  of each of its nodes, in order, with its q row, and q at a node below the bonus token is the
  drafter's distribution given the real context (the guess came true). Whether the subtree is used
  depends on the prepared root's children and the target's draws, not on the draws below it. So
  overlap is exact here exactly when drafting afresh is: no restriction is needed.

**A top-k best-first search is carried instead** (SpecExec): rather than one guess, the drafter
keeps expanding the best unexpanded nodes of the search the verified tree came from
(`ModelDrafter.grow`) — every outcome is covered in proportion to its draft probability — and the
next round starts from that search re-rooted at the target's bonus token. The target's pass runs
on the calling thread and the drafter on one thread of idle priority (Linux SCHED_IDLE): on a CPU
whose target waits on the disk, the drafter gets a core only while the target's threads sleep. (One
thread: a second llama.cpp OpenMP team makes libgomp throttle every team's spinning, which slows
every decode of the process.) The tree is still a function of the context and the drafter's
distributions only, so every rule stays exact.

Drafting beside a pass takes cores from it, so the planner overlaps only where the drafter has
cores of its own (a GPU target, spare cores); README, "Larger than memory", has what carrying and
guessing measured on 2 cores with the target streaming from disk, and the commands.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

import numpy as np

from ondevice.decode.protocols import MAX_BUDGET, Drafter, DraftSpec, Target
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Verdict

def prepared_spec(spec: DraftSpec, room_after: int, tokens_left_after: int) -> DraftSpec | None:
    """How to draft the next tree if this round emits the guess (None: the loop would end, or not draft).

    room_after / tokens_left_after: context room and tokens still wanted after the guess is emitted.
    """
    if tokens_left_after <= 0 or room_after < 2:
        return None
    next_budget = min(spec.budget, room_after - 1)  # what the engine allows the next round
    deeper = None if spec.max_depth is None else spec.max_depth + 1
    return replace(spec, budget=min(next_budget + 1, MAX_BUDGET), max_depth=deeper)  # + 1: re-rooting drops a level


@dataclass
class Guess:
    """A tree drafted for the outcome "the target accepts `path`" of the tree being verified."""

    path: list[int]  # node indices of the verified tree, root first
    tree: DraftTree  # drafted from context + the path's tokens; its root is the path's leaf

    def next_tree(self, verdict: Verdict) -> DraftTree | None:
        """The prepared tree re-rooted at the target's bonus token, if the guess came true."""
        if verdict.path != self.path:
            return None
        bonus = verdict.tokens[-1]
        child = next((c for c in self.tree.children(0) if int(self.tree.tokens[c]) == bonus), None)
        return None if child is None else self.tree.subtree(child)


def idle_priority() -> None:
    """Run this thread, and the threads it starts, only on otherwise idle cores (Linux SCHED_IDLE;
    elsewhere the lowest nice value, where a thread can have its own)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


class Overlap:
    """Runs the target's passes in one worker thread so the drafter can work meanwhile."""

    def __init__(self, target: Target, drafter: Drafter):
        self.target = target
        self.drafter = drafter
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ondevice-target")
        self.idle = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ondevice-grow", initializer=idle_priority)

    def close(self) -> None:
        """Stop the worker threads (after the pass or expansion they may be running)."""
        self.pool.shutdown(wait=True)
        self.idle.shutdown(wait=True)

    def verify_growing(self, tree: DraftTree, stats) -> np.ndarray:
        """target.forward_tree(tree) on this thread while the drafter grows its search at idle priority.

        The pass goes to stats.verify_seconds; what the drafter ran past the pass (its last batch) to
        stats.draft_seconds."""
        stop = threading.Event()
        t0 = time.perf_counter()
        growing = self.idle.submit(self.drafter.grow, stop.is_set)
        try:
            logits, forward_s = _timed(self.target.forward_tree, tree)
        finally:
            stop.set()
            wait([growing])  # never leave the drafter in the middle of an expansion
        growing.result()
        stats.verify_seconds += forward_s
        stats.pass_seconds.append((len(tree), forward_s))
        stats.draft_seconds += max(0.0, time.perf_counter() - t0 - forward_s)
        stats.prepared_trees += 1
        return logits

    def forward(
        self, tree: DraftTree, context: list[int], spec: DraftSpec, room: int, tokens_left: int, stats
    ) -> tuple[np.ndarray, Guess | None]:
        """target.forward_tree(tree) in the worker while this thread drafts for the likely outcome.

        room / tokens_left: context room and tokens still wanted before this round. Adds the pass to
        stats.verify_seconds, the draft to stats.draft_seconds and the time both ran at once to
        stats.concurrent_seconds. Returns the logits and the guess (None: nothing worth preparing).
        """
        path = tree.likely_path()
        next_spec = prepared_spec(spec, room - len(path), tokens_left - len(path))  # the guess emits len(path) tokens
        if next_spec is None:
            logits, forward_s = _timed(self.target.forward_tree, tree)
            stats.verify_seconds += forward_s
            stats.pass_seconds.append((len(tree), forward_s))
            return logits, None
        guess_context = list(context) + [int(t) for t in tree.tokens[path[1:]]]
        t0 = time.perf_counter()
        future = self.pool.submit(_timed, self.target.forward_tree, tree)
        try:
            prepared, draft_s = _timed(self.drafter.draft, guess_context, next_spec)
        finally:
            wait([future])  # never leave the target in the middle of a pass
        logits, forward_s = future.result()
        wall = time.perf_counter() - t0
        stats.verify_seconds += forward_s
        stats.pass_seconds.append((len(tree), forward_s))
        stats.draft_seconds += draft_s
        stats.concurrent_seconds += max(0.0, draft_s + forward_s - wall)
        stats.prepared_trees += 1
        return logits, Guess(path, prepared)
