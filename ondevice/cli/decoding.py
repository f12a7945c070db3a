"""What generate, chat and bench share: the consoles, loading with a spinner, how to answer
(`Decoding`: the draft spec made from --tree/--budget, the sampling) and the stats line printed
after each answer."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import typer
from rich.console import Console

from ondevice import pipeline
from ondevice.cli.literal import literal, say
from ondevice.decode.engine import Stats
from ondevice.errors import OndeviceError
from ondevice.loading.options import Answers, LoadOptions
from ondevice.pipeline import Pipeline
from ondevice.decode.protocols import BUILDERS, DEFAULT_BUDGET, FREE_BUILDERS, FREE_TREE_NODES, MAX_BUDGET, MODEL_BUILDERS, DraftSpec
from ondevice.decode.verify import Sampling

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def check_budget(budget: int) -> None:
    if not 1 <= budget <= MAX_BUDGET:
        raise OndeviceError(f"--budget must be between 1 and {MAX_BUDGET} (got {budget}).")


def make_spec(tree: str, budget: int | None, no_draft: bool, sampling: Sampling) -> DraftSpec | None:
    if no_draft:
        return None
    if tree == "auto":  # the pipeline's planner picks builder and budget for this machine
        if budget is not None:
            check_budget(budget)
        return DraftSpec(builder="auto", budget=budget or 0, temperature=sampling.temperature, seed=sampling.seed)
    if tree not in BUILDERS:
        raise OndeviceError(f"unknown tree builder {tree!r}; choose one of {', '.join(BUILDERS + ('auto',))}.")
    budget = DEFAULT_BUDGET[tree] if budget is None else budget
    check_budget(budget)
    return DraftSpec(builder=tree, budget=budget, temperature=sampling.temperature, seed=sampling.seed)


@dataclass
class Decoding:
    """How to answer, as chat and generate take it from their flags (chat's /set changes it): how
    long, how to sample, how to draft."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    tree: str = "auto"
    budget: int | None = None
    think: bool | None = None  # Qwen3's thinking switch; None: the chat template's default

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.top_k, self.seed)

    def spec(self, draft: bool = True) -> DraftSpec | None:
        """The draft spec of --tree/--budget (None: --no-draft, the target alone); OndeviceError if bad."""
        return make_spec(self.tree, self.budget, not draft, self.sampling)


def stats_line(stats: Stats, pipe=None) -> str:
    """The one line after an answer: speed, passes, time split, how its rounds were drafted and,
    when the planner chose (--tree auto), what it measured and predicted."""
    split = ""
    if stats.decode_seconds > 0:
        parts = {name: seconds for name, seconds in stats.round_split().items() if seconds is not None}
        names = {"draft": "draft", "target_compute": "target", "disk_wait": "disk wait", "overhead": "other"}
        split = " · " + " / ".join(f"{names[n]} {100 * max(s, 0.0) / stats.decode_seconds:.0f}%" for n, s in parts.items())
        if stats.disk_utilization is not None:
            split += f" · disk busy {100 * stats.disk_utilization:.0f}%"
        if stats.cpu_busy_cores is not None:
            split += f" · CPU {stats.cpu_busy_cores:.1f} cores busy"
    return (
        f"{stats.tokens} tokens · {stats.tokens_per_second:.1f} tok/s · {stats.tokens_per_pass:.2f} tokens/pass"
        f" over {stats.target_passes} target passes{split} · prompt {stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f}s"
        f" · {rounds_text(stats.rounds_by_config)}" + planner_text(pipe)
    )


def rounds_text(rounds: dict[str, int]) -> str:
    """"target alone" or "best-first@15 ×30, target ×3" (rounds per configuration, most first)."""
    if not rounds or set(rounds) == {"target"}:
        return "target alone"
    return ", ".join(f"{label} ×{n}" for label, n in sorted(rounds.items(), key=lambda x: -x[1]))


def planner_text(pipe) -> str:
    plan = getattr(pipe, "plan", None)
    if plan is None or pipe.planner is None:
        return ""
    summary = pipe.planner.summary()
    parts = [_arm_text(summary["arm"])] if summary["arm"] else []
    if summary["runner_up"]:
        parts.append("runner-up " + _arm_text(summary["runner_up"]))
    if summary["audit_share"] > 0:
        parts.append(f"audits {100 * summary['audit_share']:.1f}% of the time")
    if summary["profile"] != "measured":
        parts.append({"none": "no profile yet", "measuring": "profile being measured", "busy": "profile taken on a busy machine"}[summary["profile"]])
    return " · planner: " + "; ".join(parts)


def _arm_text(arm: dict) -> str:
    name = "target alone" if arm["name"] == "target" else arm["name"]
    measured = f"{arm['measured_tokens_per_second']:.1f} tok/s measured" if arm["measured_tokens_per_second"] else "not measured"
    predicted = f", {arm['predicted_tokens_per_second']:.1f} predicted" if arm["predicted_tokens_per_second"] else ""
    return f"{name} {measured}{predicted}"


def keeping_drafter(load: LoadOptions, specs) -> LoadOptions:
    """The load options, with the drafter model kept where one of `specs` needs it (a tree of the
    drafter's builders, or auto held to --budget): otherwise a target streaming from disk may load
    without it, its RAM given to the target's layers (loading/drafter_room.py), and its buffers sized for
    the largest free tree among `specs` (`LoadOptions.free_tree_nodes`)."""
    needs = any(s is not None and (s.builder in MODEL_BUILDERS or (s.builder == "auto" and s.budget)) for s in specs)
    if needs and load.keep_drafter is False:
        raise OndeviceError("--drop-drafter leaves out the drafter model that this --tree needs; drop one of them.")
    free = [s.budget + 1 for s in specs if s is not None and s.builder in FREE_BUILDERS]
    load = replace(load, free_tree_nodes=max(free + [FREE_TREE_NODES]))
    return replace(load, keep_drafter=True) if needs else load


def load_pipeline(load: LoadOptions, answers: Answers | None = None) -> Pipeline:
    """Load (and on first use download) the pipeline, with a spinner on stderr; answers: see `loading/options.Answers`."""
    with err.status("loading models…") as spinner:
        return pipeline.load_pipeline(load, status=lambda message: spinner.update(literal(f"{message}…")), answers=answers)


def run_outliving_lost_workers(rpc: str, command: str) -> None:
    """With --rpc, `ondevice chat|serve` runs as a child that is started again without a worker it
    lost (rpc/supervise.py); returns at once in that child, or where argv is not this command's."""
    from ondevice.rpc import library, supervise

    if supervise.is_child() or sys.argv[1:2] != [command]:
        return
    code = supervise.supervise(sys.argv[1:], list(library.parse_workers(rpc)), say=lambda line: say(err, line, "dim"), keep_state=command == "chat")
    raise typer.Exit(code)
