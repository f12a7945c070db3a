"""`ondevice models --predict` (and `ondevice profile` on a pair not downloaded): predicted speed
of each catalog pair on this machine, beside what `ondevice bench` measured where it has run."""

from __future__ import annotations

import json

from rich import box
from rich.console import Console
from rich.table import Table

from ondevice.catalog.pairs import ModelPair
from ondevice.cli.placement_view import target_place
from ondevice.loading.options import LoadOptions
from ondevice.machine.ram import ram_budget
from ondevice.plan.acceptance import MEASURED_PRIOR
from ondevice.synthetic.forecast import Forecast, forecast, plan_config


def show_forecasts(pairs: list[ModelPair], as_json: bool = False, out: Console | None = None, opts: LoadOptions | None = None) -> list[Forecast]:
    """Print the forecasts for the target backend and memory budgets in `opts` (default: a plain chat's)."""
    out = out or Console(highlight=False)
    forecasts = [forecast(pair, opts) for pair in pairs]
    budget = ram_budget()
    lives = {pair.name: target_place(pair, budget) for pair in pairs}  # the memory plan the loader uses
    if as_json:
        out.file.write(json.dumps([{**forecast_record(f), "target_lives": lives[f.pair]} for f in forecasts]) + "\n")
        return forecasts
    out.print(forecast_table(forecasts, lives))
    for line in footnotes(forecasts):
        out.print(line)
    return forecasts


def forecast_table(forecasts: list[Forecast], lives: dict[str, str]) -> Table:
    backend = forecasts[0].backend if forecasts else ""
    table = Table(title=f"predicted tok/s on this machine ({backend}) · measured by `ondevice bench`", box=box.SIMPLE)
    table.add_column("pair", no_wrap=True)
    table.add_column("target lives", overflow="fold")
    table.add_column("alone", justify="right")
    table.add_column("with speculation (best plan)", overflow="fold")
    table.add_column("top-1", justify="right")
    for f in forecasts:
        acceptance = f"{f.top1:.2f} {f.acceptance}"
        if f.target is None or f.drafter is None:
            table.add_row(f.pair, lives[f.pair], "not measured", "", acceptance)
            continue
        table.add_row(f.pair, lives[f.pair], _pair_of(f.alone, f.measured_tps("target only")), _speculation(f), acceptance)
    return table


def _speculation(f: Forecast) -> str:
    spec = f.speculative
    if spec is None or spec.budget == 0:
        return "no tree fits the measured curve"
    text = f"{plan_config(spec)}: {_pair_of(spec.predicted_tokens_per_second, None)} ({spec.predicted_tokens_per_pass:.1f} tok/pass)"
    measured = f.measured_speculative()
    if measured:
        text += f" · {measured[1]:.1f}" + ("" if measured[0] == plan_config(spec) else f" ({measured[0]})")
    if f.planner and f.planner.budget == 0:
        text += "; auto runs the target alone"
    return text


def _pair_of(predicted: float | None, measured: float | None) -> str:
    text = "—" if predicted is None else f"{predicted:.1f}"
    return text + (f" · {measured:.1f}" if measured is not None else "")


def footnotes(forecasts: list[Forecast]) -> list[str]:
    lines = []
    missing: dict[str, list[Forecast]] = {}  # one synthetic run measures every pair with the same shapes
    for f in forecasts:
        if f.to_measure:
            missing.setdefault(f.shapes, []).append(f)
    if missing:
        lines.append("not measured on this machine yet; one synthetic run each (random weights, nothing downloaded):")
        lines += [f"  {first.to_measure}" + (f"   (also {', '.join(f.pair for f in rest)})" if rest else "") for first, *rest in missing.values()]
    kinds = {f.acceptance for f in forecasts}
    if "prior" in kinds or "assumed" in kinds:
        lines.append(f"top-1: how often the drafter's first choice is the target's. prior: {MEASURED_PRIOR['qwen2.5']}; "
                     "assumed: the same numbers for a family not measured yet; measured: this pair's own verifications here.")  # fmt: skip
    lines.append("[dim]predicted · measured: curves of synthetic twins (`ondevice bench --synthetic`) and the cost model of "
                 "`--tree auto`; measured numbers appear once `ondevice bench -m PAIR` has run the real pair.[/]")  # fmt: skip
    return lines


def forecast_record(f: Forecast) -> dict:
    spec, planner = f.speculative, f.planner
    return {
        "pair": f.pair, "target_shape": f.target_shape, "backend": f.backend, "acceptance": f.acceptance,
        "measured_placement": f.target.placement if f.target else None, "to_measure": f.to_measure,
        "predicted_alone_tokens_per_second": f.alone,
        "predicted_speculative": None if spec is None else {"config": plan_config(spec), "depth": spec.depth,
                                                            "tokens_per_pass": spec.predicted_tokens_per_pass,
                                                            "tokens_per_second": spec.predicted_tokens_per_second},
        "planner_choice": None if planner is None else ("target only" if planner.budget == 0 else plan_config(planner)),
        "measured": f.measured,
    }  # fmt: skip
