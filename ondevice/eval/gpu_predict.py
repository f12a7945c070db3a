"""Predicted tok/s of the 32B and 70B pairs from the GPU check's measured curves (a prediction).

    tok/s = the planner's cost model (`plan/cost_model.choose_plan`, what `--tree auto` runs) on
            Curves(target pass vs tokens, draft call vs batch) measured by the check,
            with p[k] = the default pair's measured acceptance (`plan/acceptance.acceptance_for`)

Neither curve is the pair ondevice would run on a user's GPU machine: the targets are synthetic
(random weights at the real shapes and Q4_K_M blocks), the drafters run in torch on the same GPU
(ondevice drafts with llama.cpp on the CPU, which the GPU machine does not have), drafting and
verifying one after the other, and the acceptance is Qwen2.5-Coder 0.5B→1.5B's, not the pair's own.
"""

from __future__ import annotations

from ondevice.plan.acceptance import MEASURED_PRIOR, acceptance_for
from ondevice.plan.cost_model import choose_plan
from ondevice.plan.curve import Curves, LatencyCurve

# (catalog pair, target preset, drafter preset): the 32B-class and the 70B-class pair
PAIRS = (("qwen2.5-32b", "qwen2.5-32b", "qwen2.5-0.5b"), ("llama3.3-70b", "llama-3.3-70b", "llama-3.2-1b"))
DEFAULT_PAIR, DEFAULT_FAMILY = "qwen2.5-coder-1.5b", "qwen2.5"
ANCHOR = {
    "system": "UMbreLLa", "hardware": "RTX 4090 (24 GB, PCIe 4.0)", "model": "Llama-3.1-70B-AWQ int4, 8B or 1B drafter",
    "tokens_per_second": 8.6, "what": "published, chat, greedy (DESIGN.md anchors)",
}  # fmt: skip


def predictions(steps: dict, facts: dict, gpu_memory: str) -> list[dict]:
    """One record per pair: the prediction, or why there is none (a curve not measured)."""
    p_rank, source = acceptance_for(DEFAULT_PAIR, DEFAULT_FAMILY)
    out = []
    for pair, target_name, drafter_name in PAIRS:
        target, drafter = _curve(steps, f"target:{target_name}"), _curve(steps, f"drafter:{drafter_name}")
        record = {"pair": pair, "target": target_name, "drafter": drafter_name}
        if target is None or drafter is None:
            missing = [name for name, curve in ((f"target:{target_name}", target), (f"drafter:{drafter_name}", drafter)) if curve is None]
            out.append({**record, "why": f"not predicted: {', '.join(missing)} not measured"})
            continue
        plan = choose_plan(Curves(target, drafter), p_rank, overlap_possible=False, min_speedup=0.0)
        out.append({
            **record, "predicted_tokens_per_second": plan.predicted_tokens_per_second, "config": f"{plan.builder} @{plan.budget}",
            "depth": plan.depth, "predicted_tokens_per_pass": plan.predicted_tokens_per_pass,
            "target_alone_tokens_per_second": plan.target_only_tokens_per_second, "top1_acceptance": float(p_rank[0]),
            "acceptance": f"{source}: {MEASURED_PRIOR[DEFAULT_FAMILY]}" if source != "measured" else f"measured: {DEFAULT_PAIR}'s own verifications",
            "statement": statement(target_name, drafter_name, facts, gpu_memory),
        })  # fmt: skip
    return out


def _curve(steps: dict, name: str) -> LatencyCurve | None:
    step = steps.get(name, {})
    if step.get("status") != "ok" or not step.get("ns"):
        return None
    return LatencyCurve(tuple(step["ns"]), tuple(step["curve_seconds"]))


def statement(target: str, drafter: str, facts: dict, gpu_memory: str) -> str:
    gpu = facts.get("gpu") or "this machine's device"
    return (
        f"A prediction, not a measurement: the cost model of --tree auto on the measured pass-time curve of a synthetic {target} "
        f"(random weights at its real shapes, Q4_K_M blocks streamed from pinned RAM within --gpu-memory {gpu_memory} on {gpu}) "
        f"and the measured draft-call curve of a synthetic {drafter} resident on the same device in torch (ondevice's llama.cpp CPU "
        "drafter cannot run there; drafting and verifying one after the other), with the acceptance the default pair "
        "(Qwen2.5-Coder 0.5B→1.5B) measured, not this pair's own."
    )
