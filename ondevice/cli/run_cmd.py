"""`ondevice generate`: one answer, as text or as one JSON object with the decoding stats."""

from __future__ import annotations

import json
import sys

import typer

from ondevice.cli import options as opt
from ondevice.cli.decoding import err, load_pipeline, make_spec, stats_line
from ondevice.engine import Stats
from ondevice.pipeline import LoadOptions
from ondevice.plan.cost_model import plan_as_dict
from ondevice.verify import Sampling


@opt.load_options
def generate(
    prompt: str = typer.Argument(..., help="The prompt (sent through the chat template unless --raw)."),
    max_tokens: opt.MaxTokens = 256,
    temperature: opt.Temperature = 0.0,
    top_p: opt.TopP = 1.0,
    top_k: opt.TopK = 0,
    seed: opt.Seed = 0,
    tree: opt.Tree = "auto",
    budget: opt.Budget = None,
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the chat template."),
    think: opt.Think = None,
    as_json: opt.Json = False,
    *,
    load: LoadOptions,
) -> None:
    """Generate one answer for PROMPT and exit."""
    sampling = Sampling(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    spec = make_spec(tree, budget, not load.draft, sampling)
    pipe = load_pipeline(load)
    if think is not None and not pipe.tokenizer.can_switch_thinking:
        err.print(f"[dim]{pipe.pair.target.name}'s chat template has no thinking switch: --{'' if think else 'no-'}think changes nothing[/]")
    ids = pipe.encode_prompt(prompt) if raw else pipe.encode_chat([{"role": "user", "content": prompt}], think=think)
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
        err.print(f"[dim]{stats_line(stats, pipe.plan)}[/]")
        if getattr(pipe.engine.target, "streamer", None) is not None:
            err.print(f"[dim]{pipe.engine.target.placement_summary()}[/]")


def result_json(pipe, prompt_ids, text, token_ids, stats: Stats) -> dict:
    spec, plan = stats.spec, pipe.plan
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
        "plan": plan_as_dict(plan) if plan else None,
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
