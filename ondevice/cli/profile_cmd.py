"""`ondevice profile`: what this machine is, what it measured, and the draft plan that follows.

The first run for a model pair measures (minutes: it loads the target and the drafter, on a CPU
with every backend: llama.cpp and ONNX Runtime, in the same run); later runs show the saved profile
until the hardware or the model files change, or `--refresh` is given. The plan shown is the one
`ondevice chat` starts with: the same AutoPlanner, with the acceptance and prompt-lookup estimates
learned so far, its fallbacks, and no overhead measured yet; the backends table says which pair
of backends `--target-backend auto --drafter-backend auto` picks from these curves (plan/backends.py).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ondevice.catalog import hub
from ondevice.catalog.choose import is_catalog_name
from ondevice.catalog.pairs import load_pair
from ondevice.cli import options as opt
from ondevice.cli.literal import literal, say
from ondevice.loading.choices import load_backends
from ondevice.loading.options import LoadOptions
from ondevice.plan.auto import AutoPlanner
from ondevice.plan.backends import BackendOption, backend_options, best_backends
from ondevice.plan.cost_model import Plan, plan_as_dict
from ondevice.plan.profile import Profile, ProfileBackends, profile_path

Refresh = Annotated[bool, typer.Option("--refresh", help="Measure again even if a saved profile is current.")]

console = Console(highlight=False)


@opt.load_options
def profile(as_json: opt.Json = False, refresh: Refresh = False, *, load: LoadOptions) -> None:
    """Show this machine's facts, bandwidths and latency curves, and the draft plan they imply.

    For a catalog pair that is not downloaded: its predicted speed here instead (`ondevice models
    --predict`), from synthetic curves; nothing is downloaded."""
    if load.target is None and load.drafter is None and is_catalog_name(load.model) and not _downloaded(load_pair(load.model)):
        from ondevice.cli.forecast_view import show_forecasts  # lazy: the synthetic measurements import torch (~1 s)

        show_forecasts([load_pair(load.model)], as_json, console, load)
        if not as_json:
            say(console, f"{load_pair(load.model).name} is not downloaded: this is a prediction. "
                         f"`ondevice download {load_pair(load.model).name}` and run again to profile the real files.", "dim")  # fmt: skip
        return
    backends = load_backends(load)  # the pipeline chooses the backends (one place)
    show_profile(backends, as_json=as_json, refresh=refresh)


def _downloaded(pair) -> bool:
    return hub.is_downloaded(pair.target) and hub.is_downloaded(pair.drafter)


def show_profile(backends: ProfileBackends, as_json: bool = False, refresh: bool = False, out: Console = console) -> Profile:
    """Measure (or reuse) the profile for these backends and print it as tables or one JSON object."""
    planner = AutoPlanner(backends, show=not as_json, refresh=refresh, compare=True)
    prof, reused, p_rank = planner.profile, planner.reused, planner.tracker.p_rank
    planner.price()
    plan = planner.plan
    options = backend_options(prof, p_rank)
    memory = backends.memory
    if as_json:
        record = {**prof.to_dict(), "reused": reused, "p_rank": p_rank.round(4).tolist(), "plan": plan_as_dict(plan),
                  "backend_options": [{"target": o.target, "drafter": o.drafter, "plan": plan_as_dict(o.plan)} for o in options],
                  "placement": memory.to_dict() if memory is not None else None, "arms": arms_record(planner)}  # fmt: skip
        out.file.write(json.dumps(record) + "\n")  # verbatim: no Rich markup or wrapping
        return prof
    out.print(machine_table(prof))
    if memory is not None:
        out.print(memory_line(memory, prof))
    out.print(curves_table(prof))
    if len(options) > 1:
        out.print(backends_table(options, best_backends(prof, p_rank), backends))
    for what, why in prof.skipped.items():
        out.print(Text.assemble((f"{what} not measured:", "yellow"), " ", literal(why)), soft_wrap=True)
    out.print(arms_table(planner))
    out.print(plan_line(plan))
    if prof.busy:
        out.print(f"[yellow]other processes used ~{prof.others_cores:.1f} cores while this profile was measured:[/] "
                  "some sizes may read slow; it is measured again when a chat is idle, or run `ondevice profile --refresh`")
    how = "saved profile" if reused else f"measured in {prof.measure_seconds:.0f}s"
    path = profile_path(prof.machine.fingerprint(), prof.pair, prof.backend)
    say(out, f"{how}, {prof.created} · {path}{' · --refresh measures again' if reused else ''}", "dim")
    return prof


def memory_line(memory, prof: Profile) -> str:
    """Where the target lives (the memory plan), and what streaming it costs at the measured disk speed."""
    text = f"[bold]placement:[/] {memory.describe()}"
    if memory.streams and prof.bandwidths.disk_read:
        text += f"; at {prof.bandwidths.disk_read:.1f} GB/s that is {memory.bytes_read_per_pass / (prof.bandwidths.disk_read * 1e9):.2f} s of disk per pass"
    return text


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def _gbps(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f} GB/s"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms"


def machine_table(prof: Profile) -> Table:
    m, bw = prof.machine, prof.bandwidths
    table = Table(title=f"machine {m.fingerprint()}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("CPU", m.cpu_model)
    table.add_row("cores", f"{m.physical_cores} physical, {m.logical_cores} logical, {m.usable_cores} usable")
    table.add_row("SIMD", " ".join(m.simd) or "—")
    table.add_row("RAM", f"{_gib(m.ram_total)} ({_gib(m.ram_available)} available)")
    for i, g in enumerate(m.gpus or [None]):
        table.add_row(f"GPU {i}", "none" if g is None else f"{g.name}, {_gib(g.vram_total)} ({_gib(g.vram_free)} free), sm {g.capability}")
    table.add_row("disk free", _gib(m.disk_free))
    table.add_row("RAM copy", _gbps(bw.ram_copy))
    table.add_row("pinned → GPU", _gbps(bw.host_to_device))
    table.add_row("GPU → pinned", _gbps(bw.device_to_host))
    table.add_row("disk read", _gbps(bw.disk_read))
    return table


def curves_table(prof: Profile) -> Table:
    """One column per measured backend: target pass vs tokens, draft call vs batch (same run)."""
    table = Table(title=f"latency: {prof.pair} ({prof.backend})", title_justify="left")
    table.add_column("n", justify="right")
    columns = [(f"target {name}", c) for name, c in prof.targets.items()] + [(f"draft {name} (batch n)", c) for name, c in prof.drafters.items()]
    for title, _ in columns:
        table.add_column(title, justify="right")
    for n in sorted(set().union(*(c.ns for _, c in columns))):
        table.add_row(str(n), *(_ms(c(n)) if n in c.ns else "" for _, c in columns))
    return table


def backends_table(options: list[BackendOption], chosen: BackendOption | None, backends: ProfileBackends) -> Table:
    """Each measured pair of backends with its best plan, fastest first, and the one auto takes
    (the fastest, unless llama.cpp's pair is within plan/backends.py's margin of it)."""
    table = Table(title="backends: --target-backend auto --drafter-backend auto", title_justify="left")
    for name in ("target", "drafter", "plan", "tok/s predicted", ""):
        table.add_column(name, justify="right" if name == "tok/s predicted" else "left")
    for o in options:
        what = "target alone" if o.plan.budget == 0 else f"{o.plan.builder} @{o.plan.budget}"
        notes = ["← auto" if o == chosen else "", "(loaded for this profile)" if (o.target, o.drafter) == (backends.target_name, backends.drafter_name) else ""]
        table.add_row(o.target, o.drafter, what, f"{o.tokens_per_second:.1f}", " ".join(n for n in notes if n))
    return table


def arms_record(planner: AutoPlanner) -> list[dict]:
    """Every arm the planner priced or measured in this regime, fastest estimate first."""
    return [planner._arm_summary(arm) for arm, _ in planner.book.ranked(planner.prices)]


def arms_table(planner: AutoPlanner) -> Table:
    """What the planner measured per configuration in this regime (its closed loop), beside what it predicts."""
    table = Table(title=f"measured by the planner ({planner.regime}; faded, newest weighs most)", title_justify="left")
    for name in ("configuration", "tok/s estimated", "tok/s measured", "tokens measured", "tok/s predicted"):
        table.add_column(name, justify="left" if name == "configuration" else "right")
    for arm in arms_record(planner):
        number = lambda x: "—" if not x else f"{x:.1f}"  # noqa: E731
        table.add_row("target alone" if arm["name"] == "target" else arm["name"], number(arm["estimated_tokens_per_second"]),
                      number(arm["measured_tokens_per_second"]), f"{arm['measured_tokens']:.0f}", number(arm["predicted_tokens_per_second"]))
    return table


def plan_line(plan: Plan) -> str:
    if plan.budget == 0:
        return f"[bold]plan:[/] target alone, {plan.target_only_tokens_per_second:.1f} tok/s — {plan.fallback_reason}"
    mode = "drafting ∥ verifying" if plan.overlap else "draft, then verify"
    return (
        f"[bold]plan:[/] {plan.builder}, {plan.budget} drafted nodes, depth {plan.depth}, {mode}: "
        f"{plan.predicted_tokens_per_pass:.2f} tokens/pass, {plan.predicted_tokens_per_second:.1f} tok/s predicted "
        f"vs {plan.target_only_tokens_per_second:.1f} target alone ({plan.predicted_speedup:.2f}×)"
        + (f" — {plan.fallback_reason}" if plan.fallback_reason else "")
    )
