"""What decoding reports: a `Step` per target pass (the tokens it emitted), a `RoundReport` per
verified round (for the planner's closed loop), and the answer's `Stats`, which serialize
themselves as the JSON users see (`to_json`: `ondevice generate --json`, the server's `ondevice`
field).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Iterable

from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree


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
    cpu_seconds: float | None = None  # CPU time this process used while decoding, all its threads (user + system)
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

    @property
    def cpu_busy_cores(self) -> float | None:
        """Cores this process kept busy while decoding, on average (None: not measured): beside
        the round split it says whether a round was bound by the CPU (every core busy) or waited."""
        if self.cpu_seconds is None or self.decode_seconds <= 0:
            return None
        return self.cpu_seconds / self.decode_seconds

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

    def to_json(self) -> dict:
        """How the answer was made, as JSON: passes, tokens per pass, speed, time split, tree, and
        what streaming the target read."""
        return {
            "finish_reason": self.finish_reason,
            "target_passes": self.target_passes,
            "tokens_per_pass": self.tokens_per_pass,
            "accepted_per_pass": self.accepted_per_pass,
            "tokens_per_second": self.tokens_per_second,
            "prefill_seconds": self.prefill_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "overhead_seconds": self.overhead_seconds,
            "overlap_hits": self.overlap_hits,
            "tree": self.spec.builder if self.spec else "none",
            "budget": self.spec.budget if self.spec else 0,
            "rounds_by_config": self.rounds_by_config,
            "disk_read_bytes": self.disk_read_bytes,  # read from storage while decoding
            "bytes_read_per_pass": self.bytes_read_per_pass,
            "round_split_seconds": self.round_split(),  # draft / target_compute / disk_wait / overhead: adds up to decoding
            "disk_utilization": self.disk_utilization,  # share of decoding the target's disk was reading
            "cpu_busy_cores": self.cpu_busy_cores,  # cores this process kept busy while decoding, on average
        }


def collect(items: Iterable[Step | Stats]) -> tuple[list[int], Stats]:
    """A `SpecEngine.generate` run to its end: the answer's tokens and its Stats."""
    tokens: list[int] = []
    for item in items:
        if isinstance(item, Stats):
            return tokens, item
        tokens += item.tokens
    raise ValueError("the answer ended without its Stats")
