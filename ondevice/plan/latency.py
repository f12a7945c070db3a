"""Measuring latency curves: a target pass vs tree size, a drafter call vs batch size.

Timed as `ondevice.plan.timing` times any call (interleaved sweeps judged by what other processes
did, disturbed sizes sampled again). Pass sizes beyond the point where no draft tree could pay
are skipped (`worth_timing`): on a few cores they cost many single-token passes each and would
take most of a profile's minutes (docs/measurements/code-notes.md, "Pass sizes worth timing").
"""

from __future__ import annotations

from typing import Callable, Generator, Sequence

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ondevice.plan.curve import LatencyCurve, pass_sizes, powers_of_two
from ondevice.plan.timing import Timing, run_steps, timing_steps
from ondevice.decode.protocols import MAX_BUDGET
from ondevice.decode.tree import DraftTree

ALONE_CONTEXT = 64  # tokens of context the drafter-less passes are timed over (as a profile's)

MAX_TOKENS_PER_PASS = 20  # more than any tree emits per pass (best-first @1024: docs/measurements/2026-11-23-amx-xeon.md)


def worth_timing(timing: Timing, n: int) -> bool:
    """Stop after n: a pass costing more than MAX_TOKENS_PER_PASS single-token passes cannot pay,
    and larger ones cost more still."""
    smallest = min(timing.samples)
    return n > smallest and timing.seconds(n) > MAX_TOKENS_PER_PASS * timing.seconds(smallest)


def _progress(show: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), disable=not show, transient=True,
    )


def _shown(steps: Generator[int, None, Timing], label: str, show: bool, expected: int) -> Timing:
    with _progress(show) as progress:
        task = progress.add_task(label, total=expected)
        return run_steps(steps, lambda n: progress.advance(task))


class TargetPasses:
    """pass(n): a chain of n nodes verified over a random context, then undone. The context sits on
    top of whatever the target already holds (a chat's cache stays) and is put back after anyone
    else used the target in between (a chat's answer): only its length matters to the timing."""

    def __init__(self, target, context_tokens: int = 64, max_n: int = MAX_BUDGET):
        self.target, self.context_tokens = target, context_tokens
        self.start = target.n_cached
        room = target.n_ctx - self.start - context_tokens
        if room < 1:
            raise ValueError(f"the target's context ({target.n_ctx}) has no room to measure in")
        self.max_n = min(max_n, room)
        rng = np.random.default_rng(0)
        self.tokens = rng.integers(0, min(target.n_vocab, 32000), size=context_tokens + self.max_n).tolist()
        self.base: int | None = None

    @property
    def context(self) -> int:
        """Tokens of context the passes attend to."""
        return self.start + self.context_tokens

    def _ensure_context(self) -> None:
        if self.base is not None and self.target.n_cached == self.base:
            return
        if self.target.n_cached > self.start:
            self.target.truncate(self.start)
        self.start = self.target.n_cached
        self.target.prefill(self.tokens[: self.context_tokens])
        self.base = self.target.n_cached

    def __call__(self, n: int) -> None:
        self._ensure_context()
        c = self.context_tokens
        self.target.forward_tree(DraftTree.chain(self.tokens[c], self.tokens[c + 1 : c + n]))
        self.target.commit([0])
        self.target.truncate(self.base)

    def undo(self) -> None:
        """Leave the target as found: its own cache, without the measuring context."""
        if self.base is not None and self.target.n_cached >= self.start:
            self.target.truncate(self.start)
        self.base = None


def target_steps(target, ns: Sequence[int] | None = None, context_tokens: int = 64, prune: bool = True,
                 **timing) -> tuple[TargetPasses, Generator[int, None, Timing]]:
    """(the passes, a timing_steps generator over them); call passes.undo() when it is done."""
    passes = TargetPasses(target, context_tokens, max(ns or (MAX_BUDGET,)))
    ns = tuple(n for n in (ns or pass_sizes(MAX_BUDGET)) if n <= passes.max_n) or (1,)
    return passes, timing_steps(ns, passes, worth_timing if prune else None, **timing)


def measure_target_timing(target, ns: Sequence[int] | None = None, context_tokens: int = 64, show: bool = True,
                          label: str = "target pass vs tokens", prune: bool = True, **timing) -> tuple[Timing, int]:
    """(timing, tokens of context) of target passes vs tree size; the target's cache is left as found."""
    passes, steps = target_steps(target, ns, context_tokens, prune, **timing)
    try:
        return _shown(steps, label, show, len(ns or pass_sizes(MAX_BUDGET))), passes.context
    finally:
        passes.undo()


def measure_target_curve(target, ns: Sequence[int] | None = None, context_tokens: int = 64, show: bool = True,
                         label: str = "target pass vs tokens", prune: bool = False, **timing) -> LatencyCurve:
    """The curve alone (every size in `ns` unless prune)."""
    return measure_target_timing(target, ns, context_tokens, show, label, prune, **timing)[0].curve


def measure_drafter_timing(decode_batch: Callable[[int], None], batch_sizes: Sequence[int] = powers_of_two(128), show: bool = True,
                           label: str = "draft call vs batch", **timing) -> Timing:
    """Drafter latency of one decode call vs batch size; `decode_batch(n)` runs one call of n tokens
    (and undoes its cache effects), e.g. LlamaDrafter's probe_batch."""
    return _shown(timing_steps(tuple(batch_sizes), decode_batch, **timing), label, show, len(batch_sizes))


def measure_drafter_curve(decode_batch: Callable[[int], None], batch_sizes: Sequence[int] = powers_of_two(128), show: bool = True,
                          label: str = "draft call vs batch", **timing) -> LatencyCurve:
    return measure_drafter_timing(decode_batch, batch_sizes, show, label, **timing).curve
