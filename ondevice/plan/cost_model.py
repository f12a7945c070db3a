"""Hardware-aware choice of the draft tree: which builder, how many nodes, how deep — or no drafting.

Per target pass we pay for drafting and for verifying, and we emit E = E[accepted + 1] tokens:

    sequential (drafter and target share the machine):  s/token = (t_draft + t_target(n)) / E
    overlapped (drafter on CPU ∥ target on GPU, DuoDecoding):  s/token = max(t_draft, t_target(n)) / E

with n = budget + 1 tree nodes (the root too), E from Sequoia's DP (sequoia.py) or the chain formula,
and t_draft = Σ over levels of the drafter's call latency at that level's batch (one call per level:
level-by-level expansion; a chain is `budget` calls of batch 1). The overlapped model assumes the
CPU's guess of the next root is right, so it is an upper bound on the speed.

p[k] comes from `AcceptanceTracker` (acceptance.py): a prior updated by what the target actually
accepts, so the engine can re-plan when acceptance drifts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from ondevice.plan.hardware import Curves, powers_of_two
from ondevice.plan.sequoia import MAX_DEPTH, chain_tokens_per_pass, sequoia_table
from ondevice.protocols import DraftSpec


@dataclass(frozen=True)
class Plan:
    builder: str  # "chain", "best-first" (filling Sequoia's shape), "lookup" (fallback.py) or "target-only"
    budget: int  # drafted nodes per round, root excluded (0: target only)
    depth: int  # drafted levels
    predicted_tokens_per_pass: float  # E[accepted + 1]
    predicted_tokens_per_second: float
    target_only_tokens_per_second: float
    overlap: bool  # drafting runs while the target verifies
    fallback_reason: str | None = None  # why the drafter model is not used (then: lookup or budget 0)

    @property
    def predicted_speedup(self) -> float:
        return self.predicted_tokens_per_second / self.target_only_tokens_per_second

    def draft_spec(self, **sampling) -> DraftSpec | None:
        """The DraftSpec for this plan (None: do not draft); `sampling` sets temperature, seed, …
        A best-first plan was priced as a tree of at most `depth` levels, so its search stops there."""
        if self.budget == 0:
            return None
        depth = self.depth if self.builder == "best-first" else None
        return DraftSpec(builder=self.builder, budget=self.budget, max_depth=depth, **sampling)


def _draft_seconds(curves: Curves, batches: Sequence[int]) -> float:
    """One draft call per level; each costs the drafter's latency at that level's batch."""
    return sum(curves.drafter(b) for b in batches)


def _candidates(curves: Curves, p_rank: np.ndarray, budgets: Sequence[int], max_depth: int):
    """(builder, budget, depth, E[accepted + 1], t_draft, t_target) for every shape worth timing."""
    budgets = [b for b in budgets if b + 1 <= curves.target.max_n]  # never extrapolate the target
    if not budgets:
        return
    table = sequoia_table(p_rank, max(budgets), max_depth)
    for budget in budgets:
        t_target = curves.target(budget + 1)
        yield "chain", budget, budget, chain_tokens_per_pass(p_rank[0], budget), _draft_seconds(curves, [1] * budget), t_target
        for depth in range(1, min(budget, max_depth) + 1):
            shape = table.shape(budget, depth)
            if shape.depth < depth:  # allowing more depth no longer changes the tree
                break
            yield "best-first", budget, depth, shape.tokens_per_pass, _draft_seconds(curves, shape.expansions_per_level()), t_target


def _priced_plans(
    curves: Curves, p_rank, budgets: Sequence[int], max_depth: int, overlap_possible: bool, overhead_per_pass: float
):
    """Every candidate shape as a Plan with its predicted speed (the pass-time formula of the docstring)."""
    p_rank = np.asarray(p_rank, dtype=np.float64)
    target_only_tps = 1.0 / (curves.target(1) + overhead_per_pass)
    for builder, budget, depth, tokens_per_pass, t_draft, t_target in _candidates(curves, p_rank, budgets, max_depth):
        t_verify = t_target + overhead_per_pass
        t_pass = max(t_draft, t_verify) if overlap_possible else t_draft + t_verify
        seconds_per_token = float(t_pass / tokens_per_pass)
        yield Plan(builder, budget, depth, float(tokens_per_pass), 1.0 / seconds_per_token, target_only_tps, overlap_possible)


def _fastest(plans) -> Plan | None:
    return max(plans, key=lambda plan: plan.predicted_tokens_per_second, default=None)  # ties: the first


def choose_plan(
    curves: Curves,
    p_rank,
    overlap_possible: bool,
    budgets: Sequence[int] = powers_of_two(1024),
    max_depth: int = MAX_DEPTH,
    overhead_per_pass: float = 0.0,
    min_speedup: float = 1.0,
) -> Plan:
    """The plan with the fewest predicted seconds per emitted token; target-only if none beats it.

    overhead_per_pass: seconds each round costs besides drafting and the target pass (verification,
    cache bookkeeping), as the engine measures it; it is charged to target-only decoding too.
    """
    best = _fastest(_priced_plans(curves, p_rank, budgets, max_depth, overlap_possible, overhead_per_pass))
    if best is not None and best.predicted_speedup >= min_speedup:
        return best
    target_only_tps = 1.0 / (curves.target(1) + overhead_per_pass)
    return Plan("target-only", 0, 0, 1.0, target_only_tps, target_only_tps, False, _fallback_reason(curves, best, overlap_possible))


def predict(
    curves: Curves, p_rank, builder: str, budget: int, overlap_possible: bool = False, overhead_per_pass: float = 0.0,
    max_depth: int = MAX_DEPTH,
) -> Plan | None:
    """The model's best prediction for one fixed configuration (None: the model has no shape for it,
    e.g. multi-seq, or a tree beyond the measured target curve). best-first takes its best depth."""
    plans = _priced_plans(curves, p_rank, [budget], max_depth, overlap_possible, overhead_per_pass)
    return _fastest(plan for plan in plans if plan.builder == builder)


def _fallback_reason(curves: Curves, best: Plan | None, overlap_possible: bool) -> str:
    t_draft, t_target = curves.drafter(1), curves.target(1)
    if best is None:
        return f"the target curve is measured only up to {curves.target.max_n} tokens: no tree fits"
    if t_draft >= t_target and not overlap_possible:
        return f"the drafter is slower than the target ({t_draft * 1e3:.0f} ms per draft call vs {t_target * 1e3:.0f} ms per target pass)"
    return (
        f"drafting does not pay: the best plan ({best.builder}, budget {best.budget}, depth {best.depth}) "
        f"predicts {best.predicted_speedup:.2f}× the target alone ({t_draft * 1e3:.0f} ms per draft call, "
        f"{t_target * 1e3:.0f} ms per target pass)"
    )


def plan_as_dict(plan: Plan) -> dict:
    return {**asdict(plan), "predicted_speedup": plan.predicted_speedup}
