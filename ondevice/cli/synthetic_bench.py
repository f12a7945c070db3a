"""`ondevice bench --synthetic NAME`: measure a model that is not here, with random weights.

For each synthetic model NAME stands for (a preset shape, a catalog pair's target and drafter, or
a twin of a GGUF file): write it, time its passes on this machine with the backend and placement
a real model of that shape would get, print the curve, the bytes a pass reads and the bandwidth
that achieves against the machine's own, and cache the curve for `ondevice models --predict` (unless
the machine was busy while it was measured: then it says so and caches nothing). A streamed target
also shows what each pass read from storage, measured, beside the memory plan's prediction and the
layers it keeps. For a catalog pair it ends with the forecast of the real pair from these curves.
"""

from __future__ import annotations

import json

from rich.table import Table

from ondevice.catalog.pairs import list_pairs
from ondevice.cli.decoding import console, err
from ondevice.cli.forecast_view import forecast_record
from ondevice.cli.literal import say
from ondevice.errors import OndeviceError
from ondevice.loading.options import LoadOptions
from ondevice.sizes import format_bytes
from ondevice.synthetic.cache import SyntheticMeasurement
from ondevice.synthetic.forecast import Forecast, forecast_measured, plan_config
from ondevice.synthetic.measure import busy_line, compare_with_real, measure
from ondevice.synthetic.sources import SyntheticModel, resolve


def run_synthetic(name: str, sizes: list[int] | None, keep: bool, compare_real: bool, as_json: bool, load: LoadOptions) -> None:
    models = resolve(name)
    if compare_real and not any(m.real_file for m in models if m.role == "target"):
        raise OndeviceError(f"--compare-real needs the real file: {name!r} is not downloaded here (or is a preset, not a pair or a file).")
    records, measured = [], {}
    drafter = next((m for m in models if m.role == "drafter"), None)
    for model in models:
        m = measure(model, load, sizes if model.role == "target" else None, keep=keep, show=not as_json, drafter=drafter)
        measured[model.role] = m
        record = {**m.to_dict(), "cached": m.busy_cores is None}
        if m.busy_cores is not None:
            err.print(busy_line(m), markup=False, highlight=False)
        if compare_real and model.role == "target":
            record["compare_real"] = _compare(model, load, m.curve.ns, as_json)
        records.append(record)
        if not as_json:
            console.print(curve_table(m))
            for line in summary_lines(m, model):
                console.print(line)
            if "compare_real" in record:
                console.print(compare_table(record["compare_real"]))
                console.print(f"largest deviation of the twin from the real file: {record['compare_real']['max_deviation']:.0%}")
    predicted = pair_forecast(name, measured)
    if as_json:
        out = {"synthetic": name, "measurements": records}
        print(json.dumps(out | ({"forecast": forecast_record(predicted)} if predicted else {}), indent=2))
    elif predicted:
        for line in forecast_lines(predicted):
            console.print(line, markup=False, highlight=False)


def pair_forecast(name: str, measured: dict[str, SyntheticMeasurement]) -> Forecast | None:
    """The catalog pair's forecast from the curves just measured (None: NAME is no catalog pair)."""
    pair = next((p for p in list_pairs() if p.name == name), None)
    if pair is None or set(measured) != {"target", "drafter"}:
        return None
    return forecast_measured(pair, measured["target"], measured["drafter"])


def forecast_lines(f: Forecast) -> list[str]:
    where = f"; {f.target.budgets}" if f.target.budgets else ""
    lines = [
        f"forecast for the real {f.pair} here ({f.backend}{where}) — a forecast, not a measurement: the synthetic curves "
        f"above and acceptance {f.acceptance} (top-1 {f.top1:.2f}), in the cost model of --tree auto",
        f"  target alone: {f.alone:.2f} tok/s",
    ]
    spec = f.speculative
    if spec is not None and spec.budget:
        auto = "auto would run it" if f.planner and f.planner.budget else "auto would run the target alone"
        lines.append(f"  best tree, {plan_config(spec)}: {spec.predicted_tokens_per_second:.2f} tok/s "
                     f"({spec.predicted_tokens_per_pass:.2f} tokens per pass, {spec.predicted_tokens_per_second / f.alone:.1f}x alone); {auto}")  # fmt: skip
    return lines


def _compare(model: SyntheticModel, load: LoadOptions, ns, as_json: bool) -> dict:
    if not as_json:
        say(err, f"measuring the real {model.real_file.name} and its twin, alternating")
    real, twin = compare_with_real(model, load, ns, show=not as_json)
    ratios = [t / r for t, r in zip(twin.seconds, real.seconds)]
    return {"real_file": str(model.real_file), "ns": list(real.ns), "real_seconds": list(real.seconds),
            "twin_seconds": list(twin.seconds), "twin_over_real": ratios,
            "max_deviation": max(abs(x - 1) for x in ratios)}  # fmt: skip


def curve_table(m: SyntheticMeasurement) -> Table:
    what = "target pass vs tokens" if m.role == "target" else "draft call vs batch"
    table = Table(title=f"synthetic {m.shape} — {what} ({m.backend}{', ' + m.budgets if m.budgets else ''})", title_justify="left")
    extra = per_pass_columns(m)
    for col in ("n", "ms", "ms / token", *extra):
        table.add_column(col, justify="right")
    for n, t in zip(m.curve.ns, m.curve.seconds):
        table.add_row(str(n), f"{t * 1e3:.1f}", f"{t * 1e3 / n:.2f}", *(column.get(n, "–") for column in extra.values()))
    return table


def per_pass_columns(m: SyntheticMeasurement) -> dict[str, dict[int, str]]:
    """Column → {n: text} for what the passes read and how busy the disk was (where measured)."""
    per_pass, columns = m.per_pass or {}, {}
    shown = (("read_bytes", "MB read / pass", lambda b: f"{b / 1e6:.0f}"), ("disk_utilization", "disk busy", lambda u: f"{u:.0%}"))
    for key, title, text in shown:
        values = dict(zip(per_pass.get("ns", []), per_pass.get(key, [])))
        if any(v is not None for v in values.values()):
            columns[title] = {n: text(v) for n, v in values.items() if v is not None}
    return columns


def compare_table(compare: dict) -> Table:
    table = Table(title=f"twin vs {compare['real_file'].rsplit('/', 1)[-1]}: interleaved in one run, best pass of each", title_justify="left")
    for col in ("n", "real ms", "twin ms", "twin / real"):
        table.add_column(col, justify="right")
    for n, r, t, ratio in zip(compare["ns"], compare["real_seconds"], compare["twin_seconds"], compare["twin_over_real"]):
        table.add_row(str(n), f"{r * 1e3:.1f}", f"{t * 1e3:.1f}", f"{ratio:.2f}")
    return table


def summary_lines(m: SyntheticMeasurement, model: SyntheticModel) -> list[str]:
    t = m.traffic
    twin = f", twin of {model.real_file.name}" if model.real_file else ""
    lines = [f"file: {format_bytes(m.file_bytes)} of tensors (seed {m.seed}{twin}); placement: {m.placement}"]
    rate = f"{m.achieved_gbps:.1f} GB/s at n = {m.curve.ns[0]}"
    if t.reference_gbps:
        rate += f" = {m.achieved_gbps / t.reference_gbps:.0%} of this machine's {t.reference} ({t.reference_gbps:.1f} GB/s, measured now)"
    lines.append(f"bytes per pass: {format_bytes(t.bytes_per_pass)} from {t.source}; {rate}")
    if t.copy_gbps:
        lines.append(f"streamer's copy rate while copying: {t.copy_gbps:.1f} GB/s")
    if m.memory and m.memory.get("placement") == "disk":
        head = "LM head and " if m.memory["head_kept"] else ""
        read = m.read_bytes_per_pass
        measured = f"measured {format_bytes(read)} (median over pass sizes)" if read is not None else "not measured (no /proc/self/io)"
        lines.append(f"kept in RAM: {head}{m.memory['kept_layers']} of {model.shape.n_layers} layers; read per pass: {measured}, "
                     f"planned {format_bytes(m.memory['predicted_bytes_read_per_pass'])}")  # fmt: skip
    if m.note:
        lines.append(f"[dim]{m.note}[/]")
    return lines
