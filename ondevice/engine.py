"""The decode loop: draft (CPU) → verify the tree in one target pass → commit → stream.

`SpecEngine.generate` is a generator of `Step`s (the tokens each target pass produced) and ends
with a `Stats` summary. Target-only decoding is the same loop with a root-only tree, so the
speculative and plain paths share every line that decides what is emitted. With `overlap` the
drafter drafts the likely next tree while the target verifies (`ondevice.overlap`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Callable, Iterator, Sequence

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.kvcache import kept_prefix
from ondevice.overlap import Guess, Overlap
from ondevice.machine.ram import disk_read_bytes
from ondevice.protocols import TARGET_FREE, Drafter, DraftSpec, StreamCounters, Target, config_label
from ondevice.tree import DraftTree
from ondevice.verify import Sampling, verify


@dataclass
class Step:
    tokens: list[int]  # emitted by this target pass (accepted drafts + the target's own token)
    from_draft: int  # how many of them were drafted tokens
    drafted: int  # nodes in the tree (root excluded)


@dataclass
class RoundReport:
    """One verified round, for whoever plans the next (the planner's closed loop)."""

    tree: DraftTree
    path: list[int]  # accepted root-first path; len(path) tokens were emitted
    spec: DraftSpec | None  # how the tree was drafted (None: the target alone)
    pass_seconds: float  # the target's pass
    round_seconds: float  # wall clock since the previous round ended: planning, drafting, the pass, verifying, and the caller's handling of the last step
    context: int  # tokens cached before the pass (what its attention read)


@dataclass
class Stats:
    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens actually computed (the rest came from the cache)
    tokens: int = 0
    target_passes: int = 0
    drafted_nodes: int = 0
    accepted_drafts: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # target passes + verification + commit
    concurrent_seconds: float = 0.0  # drafting and a target pass ran at once (counted in both above)
    prepared_trees: int = 0  # trees drafted for a guessed outcome while the target verified
    overlap_hits: float = 0.0  # rounds drafted during the last pass: a prepared tree used counts 1, a carried search its share
    total_seconds: float = 0.0
    disk_read_bytes: int | None = None  # read from storage while decoding (None: the OS does not say)
    page_wait_seconds: float | None = None  # of verify_seconds: a streaming target's passes waiting for pages (None: not measured)
    disk_busy_seconds: float | None = None  # while decoding, the target file's disk had a read in flight (any process's)
    pass_seconds: list[tuple[int, float]] = field(default_factory=list)  # (tree nodes, seconds) per target pass
    finish_reason: str = ""
    accepted_per_pass: list[int] = field(default_factory=list)
    spec: DraftSpec | None = None  # how this answer was drafted (None: target alone); the last round's when it changed
    rounds_by_config: dict[str, int] = field(default_factory=dict)  # config_label → rounds

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.target_passes if self.target_passes else 0.0

    @property
    def bytes_read_per_pass(self) -> float | None:
        """Storage reads per target pass while decoding: ~0 when the target is in RAM, about the
        model's size when it streams from disk."""
        if self.disk_read_bytes is None or not self.target_passes:
            return None
        return self.disk_read_bytes / self.target_passes

    @property
    def target_compute_seconds(self) -> float:
        """verify_seconds less the streaming target's waits for the disk: computing and verifying."""
        return self.verify_seconds - (self.page_wait_seconds or 0.0)

    @property
    def disk_utilization(self) -> float | None:
        """Share of decoding during which the target's disk was reading (None: not measured)."""
        if self.disk_busy_seconds is None or self.decode_seconds <= 0:
            return None
        return self.disk_busy_seconds / self.decode_seconds

    def round_split(self) -> dict[str, float | None]:
        """Where decoding's time went, in seconds: drafting, the target computing (and verifying),
        waiting for the disk (a streaming target), and the rest; they add up to decode_seconds
        (drafting that ran beside a target pass is counted once, as the target's)."""
        return {"draft": self.draft_seconds - self.concurrent_seconds, "target_compute": self.target_compute_seconds,
                "disk_wait": self.page_wait_seconds, "overhead": self.overhead_seconds}

    @property
    def decode_seconds(self) -> float:
        return self.total_seconds - self.prefill_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def overhead_seconds(self) -> float:
        return self.decode_seconds - self.draft_seconds - self.verify_seconds + self.concurrent_seconds

    def add(self, other: Stats) -> None:
        """Add another answer's counts, times and per-pass lists to these (a bench row sums its
        prompts'); the finish reason and spec become the other's, the last answer's."""
        for f in fields(Stats):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name in ("finish_reason", "spec") or mine is None:
                setattr(self, f.name, theirs)
            elif isinstance(mine, dict):
                setattr(self, f.name, dict(Counter(mine) + Counter(theirs)))
            elif theirs is not None:
                setattr(self, f.name, mine + theirs)


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
        for part in (self.drafter, self.target):
            if hasattr(part, "close"):
                part.close()
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
        stats.overlap_hits += getattr(self.drafter, "carried_fraction", 0.0)  # grown during the last pass
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
        if getattr(self.drafter, "grows", lambda spec: False)(spec):  # a top-k best-first search: carry it
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
        read_at_start = disk_read_bytes()
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
            if (learn := getattr(self.drafter, "learn", None)) is not None:  # free drafters learn from the target (draft/recycle.py)
                learn(tree, logits, verdict.path)
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
        read_now = disk_read_bytes()
        stats.disk_read_bytes = None if read_now is None or read_at_start is None else read_now - read_at_start
        streamed_now = self._stream_counters()
        if streamed_at_start is not None and streamed_now is not None:
            stats.page_wait_seconds = _grown(streamed_at_start.page_wait_seconds, streamed_now.page_wait_seconds)
            stats.disk_busy_seconds = _grown(streamed_at_start.disk_busy_seconds, streamed_now.disk_busy_seconds)
        yield stats

    def _stream_counters(self) -> StreamCounters | None:
        counters = getattr(self.target, "stream_counters", None)
        return counters() if counters is not None else None
