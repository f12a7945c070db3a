"""A catalog pair's speed on this machine, predicted before it is downloaded.

A pass's cost depends on shapes, quantization and placement, not on trained weights, so the curves
of random-weight twins (`ondevice bench --synthetic PAIR`, measured once per shape and cached,
`ondevice.synthetic.cache`) stand in for the real ones. With the acceptance of the pair (learned
from its own verifications here, else its family's prior, named as such) the planner's own cost
model gives the speed:

    target alone       1 / t_target(1)
    with speculation   the best draft plan `cost_model.choose_plan` finds (used by --tree auto only
                       when it beats the target alone; else the planner falls back, and says so)

A curve that has not been measured yet is reported with the command that measures it; no number
is made up. What `ondevice bench` measured on the real pair is shown beside the prediction.

`ondevice bench --synthetic PAIR` forecasts from the curves it has just measured
(`forecast_measured`; e.g. a 7B streamed under a 3.5 GB cgroup), with the default pair's acceptance
as measured here when PAIR has not run but is of its family (`acceptance_here`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ondevice.loading import plan as load_plan
from ondevice.bench.measured import load_measured
from ondevice.catalog.pairs import ModelPair, load_pair
from ondevice.loading.options import LoadOptions
from ondevice.machine.facts import default_threads, machine_facts
from ondevice.plan.acceptance import acceptance_for
from ondevice.plan.cost_model import BUDGETS, Plan, choose_plan
from ondevice.plan.curve import Curves
from ondevice.synthetic.cache import SyntheticMeasurement, load_measurement
from ondevice.synthetic.measure import budgets_label
from ondevice.synthetic.shapes import find_shape


@dataclass
class Forecast:
    pair: str
    target_shape: str
    backend: str  # the target backend a plain `ondevice chat` would use here, e.g. "llama-cpu-t2"
    acceptance: str  # where p[k] comes from: "measured", "prior" (the family's) or "assumed" (another family's)
    top1: float = 0.0  # p[0]: how often the drafter's first choice is the target's
    target: SyntheticMeasurement | None = None  # None: not measured on this machine yet
    drafter: SyntheticMeasurement | None = None
    alone: float | None = None  # predicted tok/s, target alone
    speculative: Plan | None = None  # the fastest draft plan the cost model finds
    planner: Plan | None = None  # what --tree auto would run (target-only when drafting does not pay)
    measured: dict = field(default_factory=dict)  # config → what `ondevice bench` measured on the real pair

    shapes: str = ""  # "target shape + drafter shape": pairs alike share their measurements
    command: str = ""  # the `ondevice bench --synthetic` line that measures them

    @property
    def to_measure(self) -> str | None:
        """The command that measures what is missing, or None when nothing is."""
        return None if self.target and self.drafter else self.command

    def measured_tps(self, config: str) -> float | None:
        row = self.measured.get(config)
        return row["tokens_per_second"] if row else None

    def measured_speculative(self) -> tuple[str, float] | None:
        """The predicted plan's configuration as measured, else the fastest measured draft configuration."""
        config = plan_config(self.speculative) if self.speculative else None
        if config and self.measured_tps(config):
            return config, self.measured_tps(config)
        rows = [(c, r["tokens_per_second"]) for c, r in self.measured.items() if r.get("budget")]
        return max(rows, key=lambda row: row[1], default=None)


def plan_config(plan: Plan) -> str:
    """The plan as `ondevice bench` names a configuration: "best-first @16"."""
    return f"{plan.builder} @{plan.budget}"


def forecast(pair: ModelPair, opts: LoadOptions | None = None) -> Forecast:
    """The pair's predicted speed here, for the target backend and memory budgets in `opts`
    (default: what a plain `ondevice chat` would use)."""
    opts = opts or LoadOptions()
    threads = opts.threads or default_threads()
    backend = load_plan.backend_label(load_plan.pick_backend(opts.target_backend), threads)
    budgets = budgets_label(opts)
    fingerprint = machine_facts().fingerprint()
    family = find_shape(pair.target.shape).family if pair.target.shape else ""
    p_rank, source = acceptance_for(pair.name, family)
    result = Forecast(pair.name, pair.target.shape or "?", backend, source, float(p_rank[0]), measured=load_measured(fingerprint, pair.name, backend),
                      shapes=f"{pair.target.shape} + {pair.drafter.shape}", command=measure_command(pair.name, opts))
    if pair.target.shape and pair.drafter.shape:
        result.target = load_measurement(fingerprint, pair.target.shape, "target", backend, budgets)
        result.drafter = load_measurement(fingerprint, pair.drafter.shape, "drafter", load_plan.backend_label("llama", threads))
    if result.target is None or result.drafter is None:
        return result
    return predicted(result, p_rank)


def predicted(result: Forecast, p_rank) -> Forecast:
    """`result` with its speeds filled in from its target's and drafter's curves: the cost model as
    --tree auto runs it, over the trees the target's memory plan sizes its buffers for."""
    curves = Curves(result.target.curve, result.drafter.curve)
    overlap = "cuda" in result.backend  # drafting overlaps verification when the target is on a GPU (pipeline's rule)
    plan = result.target.memory or {}
    budgets = tuple(b for b in BUDGETS if b <= plan["max_tree"]) if plan.get("placement") == "disk" else BUDGETS  # as plan/auto.py caps them
    result.planner = choose_plan(curves, p_rank, overlap, budgets)
    result.speculative = choose_plan(curves, p_rank, overlap, budgets, min_speedup=0.0)
    result.alone = result.planner.target_only_tokens_per_second
    return result


def forecast_measured(pair: ModelPair, target: SyntheticMeasurement, drafter: SyntheticMeasurement) -> Forecast:
    """The pair's predicted speed from curves just measured (cached or not: a busy machine's are
    shown, not kept), with the acceptance of `acceptance_here`."""
    family = shape_family(pair)
    p_rank, source = acceptance_here(pair, family)
    result = Forecast(pair.name, pair.target.shape or "?", target.backend, source, float(p_rank[0]), target, drafter,
                      shapes=f"{pair.target.shape} + {pair.drafter.shape}")
    return predicted(result, p_rank)


def shape_family(pair: ModelPair) -> str:
    """The family its target's shape belongs to, as acceptance priors are keyed ("qwen2.5" for the Coder pair too)."""
    return find_shape(pair.target.shape).family if pair.target.shape else pair.family


def acceptance_here(pair: ModelPair, family: str) -> tuple[np.ndarray, str]:
    """(p[k], where it comes from): the pair's own verifications here; else, in the same family, the
    default pair's as measured here ("measured on qwen2.5-coder-1.5b"); else its family's prior."""
    p_rank, source = acceptance_for(pair.name, family)
    default = load_pair()
    if source == "measured" or default.name == pair.name or shape_family(default) != family:
        return p_rank, source
    borrowed, how = acceptance_for(default.name, family)
    return (borrowed, f"measured on {default.name}") if how == "measured" else (p_rank, source)


def measure_command(pair: str, opts: LoadOptions) -> str:
    """The `ondevice bench --synthetic` line that measures what this forecast needs."""
    flags = [f"--target-backend {opts.target_backend}"] if opts.target_backend != "auto" else []
    flags += [f"--{name}-memory {size}" for name, size in (("gpu", opts.gpu_memory), ("ram", opts.ram_memory)) if size]
    return " ".join([f"ondevice bench --synthetic {pair}", *flags])
