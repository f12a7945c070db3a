"""`ondevice bench`: target alone vs draft configurations on held-out prompts, as a table or JSON."""

from __future__ import annotations

import json
import platform
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ondevice.bench import llamacpp_rows
from ondevice.bench.measured import record_bench
from ondevice.bench.runner import BenchResult, best_of_sweep, config_name, count_same, differing_answers, forget_session, keep_fastest, run_config
from ondevice.cli import options as opt
from ondevice.cli.decoding import console, err, keeping_drafter, load_pipeline, make_spec, rounds_text
from ondevice.cli.literal import say
from ondevice.cli.profile_cmd import curves_table
from ondevice.errors import OndeviceError
from ondevice.loading.options import Answers, LoadOptions
from ondevice.machine.facts import machine_facts
from ondevice.machine.ram import peak_rss
from ondevice.plan.profile import get_profile
from ondevice.bench import prompt_sets
from ondevice.decode.verify import Sampling


def parse_list(text: str, kind=str) -> list:
    try:
        return [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OndeviceError(f"could not read the list {text!r}.") from None


def results_table(results: list[BenchResult], baseline: BenchResult | None) -> Table:
    table = Table(title="ondevice bench (decode only; prompt processing excluded)")
    columns = ("config", "tokens/pass", "tok/s", "speedup", "draft ms/pass", "draft s", "verify s", "other s", "predicted tok/s",
               "GB read/pass", "peak RSS", "= target alone")
    for col in columns:
        table.add_column(col, justify="right" if col != "config" else "left")
    for r in results:
        if r.error:
            table.add_row(r.config, "-", "skipped", *["-"] * (len(columns) - 3))
            continue
        speed = f"{r.tokens_per_second / baseline.tokens_per_second:.2f}×" if baseline and baseline.tokens_per_second else "-"
        pred = f"{r.predicted_tokens_per_second:.1f}" if r.predicted_tokens_per_second else "-"
        read = f"{r.totals.bytes_read_per_pass / 1e9:.2f}" if r.totals.bytes_read_per_pass is not None else "-"
        rss = f"{r.peak_rss_bytes / 1e9:.2f} GB" if r.peak_rss_bytes else "-"
        same = f"{r.same_as_target}/{r.prompts}" if r.same_as_target is not None else "-"
        per_pass = f"{r.tokens_per_pass:.2f}" if r.totals.target_passes else "-"
        table.add_row(r.config, per_pass, f"{r.tokens_per_second:.2f}", speed, f"{r.draft_ms_per_pass:.0f}", f"{r.totals.draft_seconds:.1f}",
                      f"{r.totals.verify_seconds:.1f}", f"{r.other_seconds:.1f}", pred, read, rss, same)
    return table


def sweep_verdict(results: list[BenchResult]) -> dict | None:
    """How the planner's choice compares with the best fixed configuration measured in the same run."""
    auto = max((r for r in results if r.builder == "auto"), key=lambda r: r.tokens_per_second, default=None)
    best = best_of_sweep(results)
    if auto is None or best is None or not best.tokens_per_second:
        return None
    ratio = auto.tokens_per_second / best.tokens_per_second
    return {"auto": auto.config, "auto_tokens_per_second": auto.tokens_per_second, "best_config": best.config,
            "best_tokens_per_second": best.tokens_per_second, "auto_over_best": ratio, "within_10_percent": ratio >= 0.9}


def save_report(out: str | None, pipe, results: list[BenchResult], max_tokens: int, prompts: int, prompt_set: str, pairs=None,
                curves: dict | None = None) -> dict:
    backends = [f"{t}/{d}" for t, d in pairs] if pairs and pairs[0] else [f"{pipe.target_backend}/{pipe.info.get('drafter_backend')}"]
    report = {"model": pipe.pair.name, "target_backend": pipe.target_backend, "backends": backends, "machine": platform.processor() or platform.machine(),
              "threads": pipe.info.get("threads"), "max_tokens": max_tokens, "prompts": prompts, "prompt_set": prompt_set,
              "results": [r.to_dict() for r in results], "sweep": sweep_verdict(results), "curves": curves,
              "placement": pipe.memory.to_dict() if pipe.memory is not None else pipe.placement,
              "drafter_choice": pipe.info.get("drafter_choice")}  # a streaming target: the drafter kept or left out, and why
    if pipe.info.get("repacked_stream") and isinstance(report["placement"], dict):
        report["placement"]["layout"] = "repacked"  # streamed from its copy in llama.cpp's repacked layouts
    if getattr(pipe.engine.target, "split", None) is not None:  # --rpc: where each layer lives, the traffic per pass
        report["rpc"] = pipe.engine.target.split.to_dict()
    if out:
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
    record_bench(machine_facts().fingerprint(), pipe.pair.name, pipe.backends.backend, results)  # beside `models --predict`
    return report


def report_line(result: BenchResult, as_json: bool) -> None:
    if not err.is_terminal and not as_json:  # logs and CI: one line per configuration as it ends
        err.print(f"{result.config}: {result.tokens_per_pass:.2f} tokens/pass, {result.tokens_per_second:.2f} tok/s")


def run_auto(pipe, prompts: list[list[int]], spec, max_tokens: int, sampling: Sampling, advance) -> tuple[BenchResult, list[list[int]]]:
    """`--tree auto` as a chat runs it: the planner re-plans before each prompt (and between rounds
    when the passes change) and learns after it. Returns the row and the answers' token ids."""
    result = BenchResult("auto", "auto", 0)
    plans, outputs, rounds = [], [], Counter()
    for ids in prompts:
        pipe.engine.cached = []
        tokens = []
        for record in pipe.stream_tokens(ids, max_tokens=max_tokens, sampling=sampling, spec=spec):
            tokens += record.token_ids
            if record.stats is not None:
                result.add(record.stats)
                rounds.update(record.stats.rounds_by_config)
        outputs.append(tokens)
        plans.append(pipe.plan)
        advance()
    result.config = "auto: " + rounds_text(dict(rounds)) + " (rounds)"
    planned = [p.predicted_tokens_per_second for p in plans if p is not None]
    result.predicted_tokens_per_second = sum(planned) / len(planned) if planned else None
    return result, outputs


def parse_backends(text: str) -> list[tuple[str, str]]:
    """"llama/llama,onnx/onnx" → [("llama", "llama"), ("onnx", "onnx")]."""
    pairs = []
    for item in parse_list(text):
        target, _, drafter = item.partition("/")
        if not drafter:
            raise OndeviceError(f"--backends takes TARGET/DRAFTER pairs such as onnx/onnx, not {item!r}.")
        LoadOptions(target_backend=target, drafter_backend=drafter).checked()
        pairs.append((target, drafter))
    return pairs


def measure_curves(pipe, as_json: bool) -> dict:
    """Measure every CPU backend's curves now (the same run as the rows after them); print them."""
    with err.status("measuring the backends' latency curves…"):
        profile, _ = get_profile(pipe.backends, refresh=True, show=False, compare=True)
    if not as_json:
        console.print(curves_table(profile))
    return {"targets": {k: c.to_dict() for k, c in profile.targets.items()}, "drafters": {k: c.to_dict() for k, c in profile.drafters.items()}}


def progress_bars(as_json: bool) -> Progress:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=err, disable=as_json)


def finish_row(result: BenchResult, outputs, reference, as_json: bool, peak: int | None = None) -> None:
    """A row is done: this process's peak memory so far (`peak`, else the kernel's count), how many
    answers equal the target alone's, one log line."""
    result.peak_rss_bytes = peak_rss() if peak is None else peak
    result.same_as_target = count_same(outputs, reference) if outputs is not None else None
    result.differing = differing_answers(outputs, reference) if outputs is not None else []
    report_line(result, as_json)


def bench_specs(pipe, ids: list[list[int]], specs, max_tokens: int, sampling: Sampling, as_json: bool, prefix: str = "", reference=None):
    """Yield (BenchResult, answers) per configuration (the target alone, auto, each tree and budget) on
    this pipeline; `reference`: the target alone's answers, when known before it runs here."""
    with progress_bars(as_json) as progress:
        for spec in specs:
            auto = spec is not None and spec.builder == "auto"
            task = progress.add_task(prefix + ("auto" if auto else config_name(spec)), total=len(ids))
            advance = lambda: progress.advance(task)  # noqa: E731
            forget_session(pipe.engine)  # the free drafters start each configuration knowing nothing of the last
            if auto:  # re-planned before every prompt and learning after each, as in a chat
                result, outputs = run_auto(pipe, ids, spec, max_tokens, sampling, advance)
            else:
                label = config_name(spec)
                predicted = pipe.planner.predict(spec.builder, spec.budget) if spec and pipe.planner else None
                try:
                    result, outputs = run_config(pipe.engine, ids, spec, max_tokens, sampling, on_prompt=advance)
                except OndeviceError as e:  # one configuration this machine cannot run: say so, measure the rest
                    if spec is None:  # the target alone cannot: no configuration can (a prompt longer than the context)
                        raise
                    result, outputs = BenchResult(label, spec.builder, spec.budget, error=str(e)), None
                    say(err, f"{label}: skipped — {e}")
                result.predicted_tokens_per_second = predicted.predicted_tokens_per_second if predicted else None
            result.config = prefix + result.config
            reference = outputs if spec is None and reference is None else reference
            finish_row(result, outputs, reference, as_json, pipe.peak_rss())
            yield result, outputs


def run_baselines(names: list[str], pipe, ids, max_tokens: int, reference, as_json: bool) -> list[BenchResult]:
    """llama-cpp-python's rows (bench/llamacpp_rows.py) on the same prompts under the same limit; the
    pipeline's models are freed first, so they do not share the RAM with them."""
    models, n_ctx, threads = pipe.pair, pipe.engine.target.n_ctx, pipe.info["threads"]
    pipe.engine.close()  # the models go; the tokenizer stays (is_end)
    rows = []
    with progress_bars(as_json) as progress:
        for name in names:
            label = llamacpp_rows.label(name)
            task = progress.add_task(label, total=len(ids))
            result, outputs = llamacpp_rows.run_named(name, models, n_ctx, threads, ids, max_tokens, pipe.tokenizer.is_end,
                                                      on_prompt=lambda: progress.advance(task))
            finish_row(result, outputs, reference, as_json)
            rows.append(result)
    return rows


NUMBERED_HELDOUT = re.compile(r"heldout(\d+)-(?:code|chat)")


def heldout_sets() -> str:
    """The held-out set names in a line: heldoutN-code / heldoutN-chat as one pattern with its N."""
    pairs = sorted({int(m[1]) for s in prompt_sets.SETS if (m := NUMBERED_HELDOUT.fullmatch(s))})
    runs, start = [], pairs[0]
    for a, b in zip(pairs, pairs[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    others = [s for s in prompt_sets.SETS if s.startswith("heldout") and not NUMBERED_HELDOUT.fullmatch(s)]
    return " / ".join(others) + f", heldoutN-code / heldoutN-chat (N = {', '.join(runs)})"


@opt.load_options
def bench(
    trees: str = typer.Option("auto,chain,best-first,multi-seq", "--trees", help="Comma-separated tree builders to compare (auto: the planner's choice)."),
    budgets: str = typer.Option(
        None, "--budgets", help="Comma-separated draft budgets (drafted nodes per target pass; default 4,16,64). "
        "With --synthetic: the pass sizes to time (tokens per target pass).", show_default=False,
    ),
    prompt_set: str = typer.Option(
        "eval", "--prompts", help="eval (held out: code + chat), code, chat, edit (code edits: where prompt lookup pays), "
        "agent (conversations that revise the same code), calibration, or the held-out sets, each written for one "
        f"measurement and never tuned on: {heldout_sets()}.",
    ),
    limit: int = typer.Option(0, "--limit", help="Use only the first N prompts (0 = all)."),
    max_tokens: opt.MaxTokens = 128,
    temperature: opt.Temperature = 0.0,
    as_json: opt.Json = False,
    out: str = typer.Option(None, "--out", help="Also write the JSON report to this file (README figures come from such files)."),
    synthetic: str = typer.Option(
        None, "--synthetic", metavar="NAME", help="Measure a model with random weights instead: a shape preset (qwen2.5-32b, "
        "llama-3.3-70b, …), a catalog pair (its target and drafter) or a GGUF to twin. Pass time vs tokens, bytes per pass "
        "and bandwidth on this machine, with the backend and placement a real model gets; cached for `ondevice models --predict`.",
    ),
    keep: bool = typer.Option(False, "--keep", help="With --synthetic: keep the generated GGUF under $ONDEVICE_HOME/synthetic/models (reused next time)."),
    compare_real: bool = typer.Option(
        False, "--compare-real", help="With --synthetic PAIR-or-GGUF: also time the real target file in the same run, alternating with its twin."
    ),
    rounds: int = typer.Option(
        1, "--rounds", min=1, help="Run the sweep this many times (pairs and configurations in turn) and keep each "
        "configuration's fastest round: other processes only ever add time. Every round's tok/s is in the JSON.",
    ),
    backends: str = typer.Option(
        None, "--backends", help="Compare backend pairs in one run, TARGET/DRAFTER comma-separated, e.g. llama/llama,onnx/onnx: "
        "their latency curves are measured first, then every configuration runs on each pair; speedups are over the first "
        "pair's target alone. Default: the pair --target-backend/--drafter-backend load.",
    ),
    baselines: str = typer.Option(
        None, "--baselines", help="Also run what a llama.cpp user would, after ondevice's rows (its models freed first): "
        "llama-cpp (llama-cpp-python's Llama, the target alone), llama-cpp-spec@K (its speculative decoding, a greedy chain of K "
        "tokens from the drafter; default K 4). Comma-separated. They share this process's memory: under a memory limit, run "
        "`python -m ondevice.eval.llamacpp_rows` in a process of its own instead.",
    ),
    *,
    load: LoadOptions,
) -> None:
    """Measure tokens per target pass and tok/s: the target alone vs each tree builder and budget.

    With --synthetic NAME: measure a model that is not downloaded (random weights, real shapes and
    GGUF block formats) — its pass-time curve on this machine."""
    if synthetic:
        from ondevice.cli.synthetic_bench import run_synthetic  # lazy: the synthetic measurements import torch (~1 s)

        return run_synthetic(synthetic, parse_list(budgets, int) if budgets else None, keep, compare_real, as_json, load)
    budgets = budgets or "4,16,64"
    if prompt_set not in prompt_sets.SETS:
        raise OndeviceError(f"unknown prompt set {prompt_set!r}; choose one of {', '.join(prompt_sets.SETS)}.")
    sampling = Sampling(temperature=temperature)
    tree_list, budget_list = parse_list(trees), parse_list(budgets, int)
    specs = [None] + [make_spec(t, None, False, sampling) for t in tree_list if t == "auto"]
    specs += [make_spec(t, b, False, sampling) for t in tree_list if t != "auto" for b in budget_list]
    if not load.draft:  # --no-draft: only the target-alone row
        specs = [None]
    load = keeping_drafter(load, specs)
    pairs = parse_backends(backends) if backends else [None]
    texts = prompt_sets.SETS[prompt_set][: limit or None]
    answers = Answers(tuple(texts), max_tokens)  # a streaming target's context is sized to them
    names = [llamacpp_rows.llamacpp_name(n) for n in parse_list(baselines)] if baselines else []
    best, report, curves, reference = {}, None, None, None  # best: config -> its fastest round
    for round_no in range(rounds):
        for i, pair in enumerate(pairs):
            pipe = load_pipeline(load if pair is None else replace(load, target_backend=pair[0], drafter_backend=pair[1]), answers)
            if len(pairs) > 1 and curves is None:
                curves = measure_curves(pipe, as_json)  # the backends' latency curves, in this run
            prefix = f"{pipe.target_backend}/{pipe.info.get('drafter_backend') or '-'}: " if len(pairs) > 1 else ""
            ids = [pipe.encode_chat(prompt_sets.messages(t)) for t in texts]
            for result, outputs in bench_specs(pipe, ids, specs, max_tokens, sampling, as_json, prefix, reference):
                reference = outputs if reference is None and result.budget == 0 and result.builder == "none" else reference
                keep_fastest(best, result)
                report = save_report(out, pipe, list(best.values()), max_tokens, len(ids), prompt_set, pairs, curves)  # a long sweep keeps what it measured
            if names and i == len(pairs) - 1 and round_no == rounds - 1:  # after everything else, under the same limit
                for row in run_baselines(names, pipe, ids, max_tokens, reference, as_json):
                    keep_fastest(best, row)
                report = save_report(out, pipe, list(best.values()), max_tokens, len(ids), prompt_set, pairs, curves)
            pipe.close()
    results = list(best.values())
    verdict = report["sweep"]
    if as_json:
        print(json.dumps(report, indent=2))
        return
    console.print(results_table(results, results[0]))
    if verdict:
        console.print(f"planner's choice {verdict['auto']}: {verdict['auto_tokens_per_second']:.2f} tok/s = "
                      f"{verdict['auto_over_best']:.2f}× the best fixed configuration ({verdict['best_config']}, "
                      f"{verdict['best_tokens_per_second']:.2f} tok/s)")
