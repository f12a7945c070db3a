"""`ondevice generate` (one shot) and `ondevice chat` (interactive, multi-turn)."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console

from ondevice.cli import options as opt
from ondevice.engine import Stats
from ondevice.errors import OndeviceError
from ondevice.optimizer import plan_as_dict as plan_dict
from ondevice.protocols import BUILDERS, MAX_BUDGET, DraftSpec
from ondevice.verify import Sampling

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)

DEFAULT_BUDGET = {"chain": 4, "best-first": 16, "multi-seq": 8, "lookup": 6}  # lookup: passes of <= 7 tokens (cheap on a CPU target)


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


def stats_line(stats: Stats, plan=None) -> str:
    busy = stats.draft_seconds + stats.verify_seconds + max(stats.overhead_seconds, 0.0)
    split = ""
    if busy > 0:
        split = (
            f" · draft {100 * stats.draft_seconds / busy:.0f}% / verify {100 * stats.verify_seconds / busy:.0f}%"
            f" / other {100 * max(stats.overhead_seconds, 0) / busy:.0f}%"
        )
    return (
        f"{stats.tokens} tokens · {stats.tokens_per_second:.1f} tok/s · {stats.tokens_per_pass:.2f} tokens/pass"
        f" over {stats.target_passes} target passes{split} · prompt {stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f}s"
        + (f" · {stats.spec.builder} @{stats.spec.budget}" if stats.spec else " · target alone")
        + (f" (planner fallback: {plan.fallback_reason})" if plan is not None and plan.fallback_reason else "")
    )


def _load(model, target_backend, no_draft, vocab_trim, threads, ctx, gpu_memory, ram_memory, overlap=None):
    from ondevice.pipeline import load

    with err.status("loading models…"):
        return load(
            opt.default_model(model), target_backend=target_backend, draft=not no_draft, vocab_trim=vocab_trim,
            threads=threads, n_ctx=ctx, gpu_memory=gpu_memory, ram_memory=ram_memory, overlap=overlap,
        )


def generate(
    prompt: str = typer.Argument(..., help="The prompt (sent through the chat template unless --raw)."),
    model: opt.Model = None,
    max_tokens: opt.MaxTokens = 256,
    temperature: opt.Temperature = 0.0,
    top_p: opt.TopP = 1.0,
    top_k: opt.TopK = 0,
    seed: opt.Seed = 0,
    no_draft: opt.NoDraft = False,
    tree: opt.Tree = "auto",
    budget: opt.Budget = None,
    target_backend: opt.TargetBackend = "auto",
    vocab_trim: opt.VocabTrim = True,
    threads: opt.Threads = None,
    ctx: opt.Ctx = 4096,
    gpu_memory: opt.GpuMemory = None,
    ram_memory: opt.RamMemory = None,
    overlap: opt.Overlap = None,
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the chat template."),
    as_json: opt.Json = False,
) -> None:
    """Generate one answer for PROMPT and exit."""
    sampling = Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    spec = make_spec(tree, budget, no_draft, sampling)
    pipe = _load(model, target_backend, no_draft, vocab_trim, threads, ctx, gpu_memory, ram_memory, overlap=overlap)
    ids = pipe.encode_prompt(prompt) if raw else pipe.encode_chat([{"role": "user", "content": prompt}])
    text, token_ids, stats = [], [], None
    for rec in pipe.stream_tokens(ids, max_tokens=max_tokens, sampling=sampling, spec=spec):
        text.append(rec.text)
        token_ids += rec.token_ids
        stats = rec.stats or stats
        if not as_json:
            sys.stdout.write(rec.text)
            sys.stdout.flush()
    if as_json:
        print(json.dumps(result_json(pipe, ids, "".join(text), token_ids, stats)))
    else:
        print()
        err.print(f"[dim]{stats_line(stats, pipe.planner.plan if pipe.planner else None)}[/]")
        if getattr(pipe.engine.target, "streamer", None) is not None:
            err.print(f"[dim]{pipe.engine.target.placement_summary()}[/]")


def result_json(pipe, prompt_ids, text, token_ids, stats: Stats) -> dict:
    spec, plan = stats.spec, pipe.planner.plan if pipe.planner else None
    return {
        "text": text,
        "prompt_token_ids": prompt_ids,
        "token_ids": token_ids,
        "finish_reason": stats.finish_reason,
        "target_passes": stats.target_passes,
        "tokens_per_pass": stats.tokens_per_pass,
        "accepted_per_pass": stats.accepted_per_pass,
        "tokens_per_second": stats.tokens_per_second,
        "prefill_seconds": stats.prefill_seconds,
        "draft_seconds": stats.draft_seconds,
        "verify_seconds": stats.verify_seconds,
        "overhead_seconds": stats.overhead_seconds,
        "overlap_hits": stats.overlap_hits,
        "tree": spec.builder if spec else "none",
        "budget": spec.budget if spec else 0,
        "target_backend": pipe.target_backend,
        "model": pipe.pair.name,
        "plan": plan_dict(plan) if plan else None,
        **placement_json(pipe.engine.target),
    }


def placement_json(target) -> dict:
    """Where the target's layers live (ollama `ps` style) and the bytes streamed per pass."""
    placement = getattr(target, "placement", None)
    if placement is None:
        return {"placement": {"on_device": "all", "from_ram": 0, "from_disk": 0}, "bytes_streamed_per_pass": 0}
    return {
        "placement": {"on_device": len(placement.on_device), "from_ram": len(placement.from_ram), "from_disk": len(placement.from_disk),
                      "summary": target.placement_summary()},
        "bytes_streamed_per_pass": placement.bytes_per_pass,
    }
