"""Benchmark: the same prompts decoded by the target alone and by each draft configuration.

Reports per configuration: tokens accepted per target pass, decode tok/s, and where time goes
(draft / verify / other). Every README figure comes from `ondevice bench`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Iterable

from ondevice.decode.stats import Stats, collect
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.verify import Sampling


@dataclass
class BenchResult:
    """One configuration's row: its prompts' `Stats` added up, and what the bench adds to them."""

    config: str
    builder: str
    budget: int
    prompts: int = 0
    totals: Stats = field(default_factory=Stats)  # every prompt's Stats, added up
    predicted_tokens_per_second: float | None = None
    error: str | None = None  # the configuration could not run (e.g. a tree bigger than the target takes)
    disk_read_bytes: int | None = None  # read from storage while decoding (None: not known)
    peak_rss_bytes: int | None = None  # this process's peak resident memory when the row ended
    same_as_target: int | None = None  # answers token-for-token equal to the target-alone row's
    differing: list[dict] = field(default_factory=list)  # the others: prompt index, answer, the target alone's (eval/tie_check.py)
    round_tokens_per_second: list[float] = field(default_factory=list)  # every round's tok/s (bench --rounds)

    @property
    def tokens_per_pass(self) -> float:
        return self.totals.tokens_per_pass

    @property
    def tokens_per_second(self) -> float:
        return self.totals.tokens_per_second

    @property
    def draft_ms_per_pass(self) -> float:
        t = self.totals
        return 1e3 * t.draft_seconds / t.target_passes if t.target_passes else 0.0

    @property
    def other_seconds(self) -> float:
        t = self.totals
        return t.decode_seconds - t.draft_seconds - t.verify_seconds

    def add(self, stats: Stats) -> None:
        self.prompts += 1
        self.totals.add(stats)

    def to_dict(self) -> dict:
        """The report's row: the bench's own fields, then the totals it shows (as they were when
        BenchResult counted them itself, so older reports compare)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "totals"}
        t = self.totals
        totals = {"tokens": t.tokens, "target_passes": t.target_passes, "drafted_nodes": t.drafted_nodes, "draft_seconds": t.draft_seconds,
                  "verify_seconds": t.verify_seconds, "decode_seconds": t.decode_seconds, "disk_read_bytes": t.disk_read_bytes}
        return {**own, **totals, "tokens_per_pass": self.tokens_per_pass, "tokens_per_second": self.tokens_per_second,
                "other_seconds": self.other_seconds, "draft_ms_per_pass": self.draft_ms_per_pass,
                "bytes_read_per_pass": t.bytes_read_per_pass, "round_split_seconds": t.round_split(),
                "disk_utilization": t.disk_utilization, "cpu_busy_cores": t.cpu_busy_cores}


def count_same(outputs: list[list[int]], reference: list[list[int]] | None) -> int | None:
    """How many answers equal the reference's token for token (None without a reference)."""
    if reference is None:
        return None
    return sum(a == b for a, b in zip(outputs, reference))


def differing_answers(outputs: list[list[int]], reference: list[list[int]] | None) -> list[dict]:
    """The answers that differ from the reference, with it: what `eval/tie_check.py` checks under
    the near-tie rule (a batched pass may flip an argmax whose top-2 margin is within the batch noise)."""
    if reference is None:
        return []
    return [{"prompt": i, "answer": a, "reference": b} for i, (a, b) in enumerate(zip(outputs, reference)) if a != b]


def keep_fastest(best: dict[str, BenchResult], result: BenchResult) -> BenchResult:
    """Another round of a configuration: keep its fastest round (other processes only ever add
    time), and every round's tok/s beside it."""
    key = result.config[: result.config.index("auto") + 4] if result.builder == "auto" else result.config  # auto's plans vary
    rounds = best[key].round_tokens_per_second if key in best else []
    if key not in best or result.tokens_per_second > best[key].tokens_per_second:
        best[key] = result
    best[key].round_tokens_per_second = rounds + [result.tokens_per_second]
    return best[key]


def best_of_sweep(results: list[BenchResult]) -> BenchResult | None:
    """The fastest fixed configuration (auto rows and the target alone excluded)."""
    fixed = [r for r in results if r.budget > 0 and r.builder != "auto"]
    return max(fixed, key=lambda r: r.tokens_per_second, default=None)


def config_name(spec: DraftSpec | None) -> str:
    return "target only" if spec is None else f"{spec.builder} @{spec.budget}"


def forget_session(engine) -> None:
    """Start a configuration with free drafters that know nothing of the last one's answers (the suffix
    history, recycled candidates); within it they learn from prompt to prompt, as in a session."""
    forget = getattr(engine.drafter, "forget", None)
    if forget is not None:
        forget()


def run_config(
    engine, prompts: Iterable[list[int]], spec: DraftSpec | None, max_tokens: int, sampling: Sampling = Sampling(),
    on_prompt: Callable[[], None] | None = None,
) -> tuple[BenchResult, list[list[int]]]:
    """Decode every prompt with one configuration; returns the summary and the generated ids."""
    result = BenchResult(config_name(spec), spec.builder if spec else "none", spec.budget if spec else 0)
    outputs = []
    forget_session(engine)
    for ids in prompts:
        engine.cached = []  # each prompt from a cold cache: comparable across configurations
        tokens, stats = collect(engine.generate(ids, max_tokens, sampling, spec))
        result.add(stats)
        outputs.append(tokens)
        if on_prompt:
            on_prompt()
    return result, outputs
