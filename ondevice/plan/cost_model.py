"""Hardware-aware choice of the draft tree: which builder, how many nodes, how deep — or no drafting.

Per target pass we pay for drafting and for verifying, and we emit E = E[accepted + 1] tokens:

    sequential:  s/token = (t_draft + t_target(n)) / E
    overlapped (DuoDecoding: the next tree is drafted while the target verifies, for the outcome
    "the target accepts the drafter's top-1 path"; see decode/overlap.py):
                 s/token = (max(t_target(n), t_draft) + (1 − h)·t_draft) / E

with n = budget + 1 tree nodes (the root too), E from Sequoia's DP (sequoia.py) or the chain formula,
and t_draft the drafter's calls, each at the profile's time for its width (a call timed with the
search's work on its rows: `ModelDrafter.probe_batch`): a chain's `budget` calls of one node;
best-first's as its exact search makes them growing the priced shape (`best_first_batches`): it expands
every node it keeps, leaves included (to learn that their children do not enter the tree), in score
order, each call the waiting nodes within BATCH_SPREAD nats of the best — one call per node where the
drafter is sure, fewer and wider where it is not, more than the shape's levels wherever it branches
(docs/measurements/2026-12-06-drafting-priced-per-call.md). The search that runs leaves the nodes
within LEAF_MARGIN of the weakest kept one unexpanded (draft/builders.py): fewer rows, so the price
is an upper bound, which the planner's measured rounds then correct.
The first call also catches up: the accepted path's last drafted token was proposed but never
decoded, so when the path ends there (p of the top-1 path) that call decodes 2 tokens, not 1
(docs/measurements/code-notes.md, "The drafter's catch-up").
Overlap is possible where the
drafter does not take the target's cores: a GPU target, or a CPU with cores to spare for both
(`overlap_possible`). On a CPU whose cores the target's threads already use, even a target that
waits on the disk leaves none free: llama.cpp's threads spin while one of them waits for a page
(measured: README, "Larger than memory"). h is the chance the guess comes true (p[0] along the shape's
top-1 path, then the target's own next token among the prepared root's children), scaled by
`hit_scale`, what the planner measured of its guesses so far (measured hits / predicted); when it
does not come true, the next tree is drafted afresh. `overlap_scale` is what overlapped rounds
measured against this prediction (memory bandwidth and caches are shared even where cores are
not). Overlap is planned only where it is predicted faster.

p[k] comes from `AcceptanceTracker` (acceptance.py): a prior updated by what the target actually
accepts, so the engine can re-plan when acceptance drifts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from ondevice.plan.curve import Curves, pass_sizes
from ondevice.plan.sequoia import MAX_DEPTH, chain_tokens_per_pass, sequoia_table
from ondevice.decode.protocols import DraftSpec
from ondevice.draft.builders import BATCH_SPREAD

# drafted nodes per pass: those whose pass (with the root) is one a profile times — 2^k or 2^k + 1
# nodes (curve.pass_sizes): filled to a tile edge, or one past it, priced as measured
BUDGETS = tuple(n - 1 for n in pass_sizes(1025) if n > 1)


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
    hit_rate: float = 0.0  # predicted chance that the tree drafted during a pass is the next one (overlap)
    shape_tokens_per_pass: float | None = None  # the rank model's E before a builder's measured gain (model_arms.py)

    @property
    def predicted_speedup(self) -> float:
        return self.predicted_tokens_per_second / self.target_only_tokens_per_second

    def draft_spec(self, **sampling) -> DraftSpec | None:
        """The DraftSpec for this plan (None: do not draft); `sampling` sets temperature, seed, …
        A best-first plan was priced as Sequoia's shape of `depth` levels (p[k] the same at every
        node), but its search is not held to that depth: it follows the drafter's own confidence,
        which on code runs deeper than the average (docs/measurements/code-notes.md, "Best-first's
        depth"). What it achieves is measured (plan/arms.py), not assumed."""
        if self.budget == 0:
            return None
        return DraftSpec(builder=self.builder, budget=self.budget, **sampling)


def _draft_seconds(curves: Curves, batches: Sequence[int], p_leaf: float) -> float:
    """One draft call per batch, each at the drafter's latency for it. The first call also decodes
    what the drafter's cache lacks: the target's bonus token, and with probability p_leaf the accepted
    path's last drafted token too (a leaf: proposed, never decoded), a batch of 2."""
    catch_up = p_leaf * (curves.drafter(2) - curves.drafter(1))
    return sum(curves.drafter(b) for b in batches) + catch_up


def best_first_batches(shape, p_rank: np.ndarray, spread: float = BATCH_SPREAD) -> list[int]:
    """The nodes of each drafter call best-first makes to grow `shape` when every node's children are
    as likely as p_rank says (draft/builders.py): first the root (the target's last token), then every
    node but the lowest-scored (whose children cannot enter the tree), in score order; a call takes
    the waiting nodes within `spread` nats of the best one."""
    logp = np.log(np.maximum(np.asarray(p_rank, dtype=np.float64), 1e-12))
    scores, children = np.zeros(len(shape.parents)), [[] for _ in shape.parents]
    for v in range(1, len(shape.parents)):
        scores[v] = scores[shape.parents[v]] + logp[shape.ranks[v]]
        children[shape.parents[v]].append(v)
    threshold = scores[1:].min() if len(scores) > 1 else 0.0
    waiting, batches = [v for v in children[0] if scores[v] > threshold], [1]
    while waiting:
        best = max(scores[v] for v in waiting)
        batch = [v for v in waiting if scores[v] >= best - spread]
        batches.append(len(batch))
        waiting = [v for v in waiting if scores[v] < best - spread] + [c for v in batch for c in children[v] if scores[c] > threshold]
    return batches


def longest_round(curves: Curves, budget: int, overhead_per_pass: float = 0.0) -> float:
    """The longest round a tree of `budget` drafted nodes is priced at: one drafter call per node and
    the catch-up certain. What an audit of an unmeasured tree is budgeted at (arms.py): on text the
    drafter is sure of, best-first's round runs there (docs/measurements/2026-12-05-planner-heldout24.md)."""
    return _draft_seconds(curves, [1] * budget, 1.0) + curves.target(budget + 1) + overhead_per_pass


def guess_hit_rate(p_rank: np.ndarray, top1_path: int, root_children: int) -> float:
    """h: the target accepts the top-1 path of `top1_path` drafted nodes, and its own next token is
    one of the `root_children` children the prepared tree gives its root."""
    return float(p_rank[0] ** top1_path * min(1.0, np.sum(p_rank[:root_children])))


def _top1_path(shape) -> int:
    """Length of the path of first-ranked children from the root of a Sequoia shape."""
    node, length = 0, 0
    while True:
        child = np.flatnonzero((shape.parents == node) & (shape.ranks == 0))
        if len(child) == 0:
            return length
        node, length = int(child[0]), length + 1


def _candidates(curves: Curves, p_rank: np.ndarray, budgets: Sequence[int], max_depth: int):
    """(builder, budget, depth, E[accepted + 1], t_draft, t_target, h) for every shape worth timing."""
    budgets = [b for b in budgets if b + 1 <= curves.target.max_n]  # never extrapolate the target
    if not budgets:
        return
    table = sequoia_table(p_rank, max(budgets), max_depth)
    for budget in budgets:
        t_target = curves.target(budget + 1)
        all_accepted = float(p_rank[0] ** budget)
        yield ("chain", budget, budget, chain_tokens_per_pass(p_rank[0], budget), _draft_seconds(curves, [1] * budget, all_accepted),
               t_target, guess_hit_rate(p_rank, budget, 1))
        for depth in range(1, min(budget, max_depth) + 1):
            shape = table.shape(budget, depth)
            if shape.depth < depth:  # allowing more depth no longer changes the tree
                break
            top1 = _top1_path(shape)
            hit = guess_hit_rate(p_rank, top1, int(np.sum(shape.parents == 0)))
            t_draft = _draft_seconds(curves, best_first_batches(shape, p_rank), float(p_rank[0] ** top1))  # leaf ≈ end of the top-1 path
            yield "best-first", budget, depth, shape.tokens_per_pass, t_draft, t_target, hit


def _priced_plans(
    curves: Curves, p_rank, budgets: Sequence[int], max_depth: int, overlap_possible: bool, overhead_per_pass: float,
    hit_scale: float = 1.0, overlap_scale: float = 1.0,
):
    """Every candidate shape as a Plan with its predicted speed (the pass-time formulas of the docstring)."""
    p_rank = np.asarray(p_rank, dtype=np.float64)
    target_only_tps = 1.0 / (curves.target(1) + overhead_per_pass)
    for builder, budget, depth, tokens_per_pass, t_draft, t_target, hit in _candidates(curves, p_rank, budgets, max_depth):
        t_verify = t_target + overhead_per_pass
        t_pass, overlap = t_draft + t_verify, False
        hit = min(1.0, hit * hit_scale)
        if overlap_possible:
            t_overlapped = overlap_scale * (max(t_verify, t_draft) + (1.0 - hit) * t_draft)
            if t_overlapped < t_pass:
                t_pass, overlap = t_overlapped, True
        seconds_per_token = float(t_pass / tokens_per_pass)
        yield Plan(builder, budget, depth, float(tokens_per_pass), 1.0 / seconds_per_token, target_only_tps, overlap, hit_rate=hit)


def priced_plans(curves: Curves, p_rank, overlap_possible: bool, budgets: Sequence[int] | None = None, max_depth: int = MAX_DEPTH,
                 overhead_per_pass: float = 0.0, hit_scale: float = 1.0, overlap_scale: float = 1.0) -> list[Plan]:
    """Every candidate tree (each builder, budget and depth) with its predicted speed."""
    return list(_priced_plans(curves, p_rank, BUDGETS if budgets is None else budgets, max_depth, overlap_possible, overhead_per_pass,
                              hit_scale, overlap_scale))


def _fastest(plans) -> Plan | None:
    return max(plans, key=lambda plan: plan.predicted_tokens_per_second, default=None)  # ties: the first


def choose_plan(
    curves: Curves,
    p_rank,
    overlap_possible: bool,
    budgets: Sequence[int] = BUDGETS,
    max_depth: int = MAX_DEPTH,
    overhead_per_pass: float = 0.0,
    min_speedup: float = 1.0,
    hit_scale: float = 1.0,
    overlap_scale: float = 1.0,
) -> Plan:
    """The plan with the fewest predicted seconds per emitted token; target-only if none beats it.

    overhead_per_pass: seconds each round costs besides drafting and the target pass (verification,
    cache bookkeeping), as the engine measures it; it is charged to target-only decoding too.
    hit_scale, overlap_scale: what overlapped rounds measured against their prediction (docstring).
    """
    best = _fastest(_priced_plans(curves, p_rank, budgets, max_depth, overlap_possible, overhead_per_pass, hit_scale, overlap_scale))
    if best is not None and best.predicted_speedup >= min_speedup:
        return best
    target_only_tps = 1.0 / (curves.target(1) + overhead_per_pass)
    return Plan("target-only", 0, 0, 1.0, target_only_tps, target_only_tps, False, _fallback_reason(curves, best, overlap_possible))


def predict(
    curves: Curves, p_rank, builder: str, budget: int, overlap_possible: bool = False, overhead_per_pass: float = 0.0,
    max_depth: int = MAX_DEPTH, hit_scale: float = 1.0, overlap_scale: float = 1.0,
) -> Plan | None:
    """The model's best prediction for one fixed configuration (None: the model has no shape for it,
    e.g. multi-seq, or a tree beyond the measured target curve). best-first takes its best depth."""
    plans = _priced_plans(curves, p_rank, [budget], max_depth, overlap_possible, overhead_per_pass, hit_scale, overlap_scale)
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
