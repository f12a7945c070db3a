"""The decode loop: draft (CPU) → verify the tree in one target pass → commit → stream.

`SpecEngine.generate` is a generator of `Step`s (the tokens each target pass produced) and ends
with a `Stats` summary. Target-only decoding is the same loop with a root-only tree, so the
speculative and plain paths share every line that decides what is emitted. With `overlap` the
drafter drafts the likely next tree while the target verifies (`ondevice.decode.overlap`).
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, Sequence

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.decode.kvcache import kept_prefix
from ondevice.decode.overlap import Guess, Overlap
from ondevice.machine.ram import disk_read_bytes, process_cpu_seconds
from ondevice.decode.protocols import TARGET_FREE, Drafter, DraftSpec, StreamCounters, Target, config_label
from ondevice.decode.stats import RoundReport, Stats, Step
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling, verify


def _grown(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def within_window(spec: DraftSpec | None, room: int) -> DraftSpec | None:
    """`spec` with a budget that never drafts past the context window (room tokens left)."""
    if spec is None or spec.budget <= 0:
        return spec
    return DraftSpec(**{**spec.__dict__, "budget": max(0, min(spec.budget, room - 1))})


class SpecEngine:
    """Owns the target's committed context; keeps it across calls so a chat reuses its cache."""

    def __init__(self, target: Target, drafter: Drafter | None, is_end: Callable[[int], bool], overlap: bool = False):
        self.target = target
        self.drafter = drafter
        self.is_end = is_end
        self.overlap = overlap  # draft the likely next tree while the target verifies
        self._worker: Overlap | None = None  # runs the target passes beside the drafter, made on first use
        self.cached: list[int] = []  # the tokens whose KV the target holds, in order
        self.closed = False

    def close(self) -> None:
        """Free everything now, not at garbage collection: the overlap worker thread, then the drafter
        and the target (llama.cpp contexts and models, an offloaded target's streaming threads)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self.drafter is not None:
            self.drafter.close()
        self.target.close()
        self.cached = []
        self.closed = True

    def _sync_prompt(self, prompt: Sequence[int], stats: Stats) -> None:
        """Make the target cache hold prompt[:-1] (prompt[-1] becomes the first tree's root)."""
        if len(prompt) == 0:
            raise OndeviceError("the prompt is empty.")
        if len(prompt) >= self.target.n_ctx:
            raise OndeviceError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; shorten it or raise --ctx."
            )
        keep = kept_prefix(self.cached, prompt)
        self.target.truncate(keep)
        t0 = time.perf_counter()
        self.target.prefill(prompt[keep:-1])
        stats.prefill_seconds = time.perf_counter() - t0
        stats.prefilled_tokens = len(prompt) - 1 - keep
        self.cached = list(prompt[:-1])

    def _tree(self, context: list[int], spec: DraftSpec | None, stats: Stats) -> DraftTree:
        if self.drafter is None or spec is None or spec.budget <= 0:
            return DraftTree.root_only(context[-1])
        t0 = time.perf_counter()
        tree = self.drafter.draft(context, spec)
        stats.draft_seconds += time.perf_counter() - t0
        stats.overlap_hits += self.drafter.carried_fraction  # grown during the last pass
        return tree

    def _forward(
        self, tree: DraftTree, context: list[int], spec: DraftSpec | None, room: int, tokens_left: int, stats: Stats
    ) -> tuple[np.ndarray, Guess | None]:
        """The target's logits for `tree`; with overlap, and a guess from the drafter for the next round."""
        if not self.overlap or self.drafter is None or spec is None or spec.budget <= 0:
            t0 = time.perf_counter()
            logits = self.target.forward_tree(tree)
            seconds = time.perf_counter() - t0
            stats.verify_seconds += seconds
            stats.pass_seconds.append((len(tree), seconds))
            return logits, None
        if self._worker is None:
            self._worker = Overlap(self.target, self.drafter)
        if self.drafter.grows(spec):  # a top-k best-first search: carry it
            return self._worker.verify_growing(tree, stats), None
        return self._worker.forward(tree, context, spec, room, tokens_left, stats)

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: Sampling = Sampling(),
        spec: DraftSpec | None = None,
        rule: str = "specexec",
        observe: Callable[[RoundReport], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        replan: Callable[[], DraftSpec | None] | None = None,
    ) -> Iterator[Step | Stats]:
        """Decode up to max_tokens after `prompt`. observe(RoundReport) sees every verified round of
        this call (the planner's closed loop, for the answers it planned). should_stop() is asked
        before every target pass: True ends the answer
        there (finish_reason "interrupted"); `cached` still names the tokens whose KV the target
        holds. replan(), if given, gives the spec of every round after the first."""
        if self.closed:
            raise OndeviceError("this pipeline is closed (its models were freed); load it again.")
        stats = Stats(prompt_tokens=len(prompt), spec=spec if self.drafter is not None else None)
        start = time.perf_counter()
        self._sync_prompt(prompt, stats)
        read_at_start, cpu_at_start = disk_read_bytes(), process_cpu_seconds()
        streamed_at_start = self._stream_counters()
        rng = np.random.default_rng(sampling.seed)
        context = list(prompt)
        room = self.target.n_ctx - len(prompt)
        prepared: DraftTree | None = None  # the next tree, drafted while the target verified
        round_start = time.perf_counter()
        while True:
            if stats.tokens >= max_tokens or room <= 0:
                stats.finish_reason = "length"
                break
            if should_stop is not None and should_stop():
                stats.finish_reason = "interrupted"
                break
            if replan is not None and stats.target_passes:
                spec = stats.spec = replan()
            if prepared is not None:
                tree, prepared = prepared, None
                stats.overlap_hits += 1
            else:
                tree = self._tree(context, within_window(spec, room), stats)
            logits, guess = self._forward(tree, context, spec, room, max_tokens - stats.tokens, stats)
            t0 = time.perf_counter()
            verdict = verify(tree, logits, sampling, rng, rule)
            self.target.commit(verdict.path)
            stats.verify_seconds += time.perf_counter() - t0
            if self.drafter is not None:  # free drafters learn from the target (draft/recycle.py)
                self.drafter.learn(tree, logits, verdict.path)
            if guess is not None:
                prepared = guess.next_tree(verdict)
            drafted = spec is not None and (spec.builder != TARGET_FREE or len(tree) > 1)
            label = config_label(spec if drafted else None)  # the target alone's round drafted nothing: "target"
            stats.rounds_by_config[label] = stats.rounds_by_config.get(label, 0) + 1
            if observe is not None:
                now = time.perf_counter()
                observe(RoundReport(tree, list(verdict.path), spec, stats.pass_seconds[-1][1], now - round_start, len(self.cached)))
                round_start = now
            self.cached.extend(int(tree.tokens[i]) for i in verdict.path)
            stats.target_passes += 1
            stats.drafted_nodes += len(tree) - 1
            stats.accepted_drafts += len(verdict.path) - 1
            stats.accepted_per_pass.append(len(verdict.path) - 1)

            emitted = verdict.tokens[: max_tokens - stats.tokens]
            end = next((i for i, t in enumerate(emitted) if self.is_end(t)), None)
            if end is not None:
                emitted = emitted[:end]
            context.extend(emitted)
            room -= len(emitted)
            stats.tokens += len(emitted)
            if emitted:
                yield Step(emitted, min(len(emitted), len(verdict.path) - 1), len(tree) - 1)
            if end is not None:
                stats.finish_reason = "stop"
                break
        stats.total_seconds = time.perf_counter() - start
        stats.cpu_seconds = process_cpu_seconds() - cpu_at_start
        read_now = disk_read_bytes()
        stats.disk_read_bytes = None if read_now is None or read_at_start is None else read_now - read_at_start
        streamed_now = self._stream_counters()
        if streamed_at_start is not None and streamed_now is not None:
            stats.page_wait_seconds = _grown(streamed_at_start.page_wait_seconds, streamed_now.page_wait_seconds)
            stats.disk_busy_seconds = _grown(streamed_at_start.disk_busy_seconds, streamed_now.disk_busy_seconds)
        yield stats

    def _stream_counters(self) -> StreamCounters | None:
        return self.target.stream_counters()
