"""The drafter model's arms: which of its trees the closed loop weighs, priced with what each builder
achieved.

The cost model prices a tree from p[k], one acceptance-by-rank for every node (acceptance.py). That
cannot tell two builders apart when they grow the same shape: at small budgets Sequoia's best shape
for the average node is a chain, so chain@B and best-first@B are predicted alike (to a thousandth of
a token). Yet best-first grows the tree the drafter's own probabilities favour, node by node,
branching where the drafter is unsure (SpecExec) — what an average p[k] cannot see (measured:
docs/measurements/code-notes.md, "Builders the cost model cannot tell apart").

So:
1. each builder's *gain*, relative to the others — its accepted drafted tokens measured ÷ what its
   plans predicted, over the same ratio pooled across builders (sums faded per round; a prior of
   1 worth GAIN_PRIOR tokens) — scales its trees' predicted accepted tokens: E' = 1 + gain·(E − 1).
   Relative, because how well the drafter guesses this text is every builder's (the acceptance
   tracker and the arms' calibration κ learn that): an absolute gain would leave an unmeasured
   builder at 1, above a measured one that came out below its prediction. Only the drafter's own
   trees are booked (GAINED: a hybrid's accepted tokens are partly its free sources'), and the
   prior is worth ~25 rounds, so one poor round does not make another builder the candidate again
   (docs/measurements/code-notes.md);
2. at one budget, best-first is the candidate unless another builder is predicted more than TIE
   faster: where the model sees no difference, the builder that adapts to the drafter is taken,
   and what it achieves is then measured (its gain; plan/arms.py times it). The hybrid tree (free
   proposals grown into the same search) is priced TIE below the best-first tree it extends: it is
   audited and wins where it measures faster, but a tie does not make it the incumbent (on chat its
   free nodes are seldom accepted and it drafts more: docs/measurements/code-notes.md, "The hybrid
   as an arm");
3. the hybrid is an arm only where the free drafters have shown text they match: the share of
   emitted tokens that rounds with a lookup or suffix match produced (fallback.LookupTracker,
   replayed over every answer for free) above HYBRID_SHARE. Where it is not, its free nodes only
   displace the drafter's (docs/measurements/code-notes.md, "The hybrid as an arm": the shares
   and tokens per pass measured).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ondevice.paths import read_state, write_json
from ondevice.plan.acceptance import acceptance_file
from ondevice.plan.arms import arm_of, family_of
from ondevice.plan.cost_model import Plan, predict, priced_plans

MODEL_ARMS = 3  # the drafter's best trees priced as arms, fastest predicted first, ...
SPREAD = 1.5  # ... their budgets at least this far apart
TIE = 0.01  # predictions this close at one budget: best-first
GAIN_PRIOR = 64.0  # a gain of 1, worth this many predicted accepted tokens (~25 rounds: one round's luck is not a builder's)
GAINED = ("chain", "best-first")  # the drafter's own trees; a hybrid's accepted tokens are partly its free sources'
GAIN_DECAY = 0.995  # per round of the builder: half-life ~140 rounds
GAIN_RANGE = (0.25, 4.0)  # a gain outside this says the round was misbooked, not the shape
HYBRID_SHARE = 0.3  # the free drafters' replayed share of matched text above which a hybrid is an arm (the trackers' prior)


class BuilderGains:
    """Per builder: faded sums of accepted drafted tokens, measured and predicted."""

    def __init__(self, sums: dict[str, list[float]] | None = None):
        self.sums = {b: [float(m), float(p)] for b, (m, p) in (sums or {}).items()}

    def pooled(self) -> float:
        """Measured ÷ predicted accepted tokens over every builder's rounds (1 with none)."""
        measured, predicted = (sum(s[i] for b, s in self.sums.items() if b in GAINED) for i in (0, 1))
        return measured / predicted if predicted > 1e-9 else 1.0

    def gain(self, builder: str) -> float:
        """The builder's measured ÷ predicted over the pooled ratio: 1 unmeasured, or measured alone."""
        if builder not in GAINED:
            return 1.0
        measured, predicted = self.sums.get(builder, (0.0, 0.0))
        low, high = GAIN_RANGE
        return min(high, max(low, (measured + GAIN_PRIOR) / (self.pooled() * predicted + GAIN_PRIOR)))

    def observe(self, builder: str, predicted_accepted: float, accepted: int) -> None:
        """One round of `builder`: its plan predicted `predicted_accepted` drafted tokens accepted
        (before any gain), the target accepted `accepted`. Builders not in GAINED are not booked."""
        if builder not in GAINED:
            return
        sums = self.sums.setdefault(builder, [0.0, 0.0])
        sums[0] = sums[0] * GAIN_DECAY + accepted
        sums[1] = sums[1] * GAIN_DECAY + predicted_accepted

    def apply(self, plan: Plan) -> Plan:
        """The plan with its builder's gain on the accepted tokens (seconds per round unchanged)."""
        shape = plan.shape_tokens_per_pass or plan.predicted_tokens_per_pass
        tokens = 1.0 + self.gain(plan.builder) * (shape - 1.0)
        seconds_per_round = plan.predicted_tokens_per_pass / plan.predicted_tokens_per_second
        return replace(plan, predicted_tokens_per_pass=tokens, predicted_tokens_per_second=tokens / seconds_per_round,
                       shape_tokens_per_pass=shape)

    # --- persistence, one file per model pair ---------------------------------------------------
    def to_dict(self) -> dict:
        return {"sums": self.sums}

    @classmethod
    def from_dict(cls, d: dict) -> "BuilderGains":
        sums = d["sums"]
        if not isinstance(sums, dict) or not all(len(v) == 2 and all(float(x) >= 0 for x in v) for v in sums.values()):
            raise ValueError("sums must map builders to [measured, predicted], not negative")
        return cls(sums)

    @staticmethod
    def path(pair: str) -> Path:
        return acceptance_file(f"{pair}.gains.json")  # beside the acceptance tracker's record

    def save(self, pair: str) -> Path:
        return write_json(self.path(pair), self.to_dict())

    @classmethod
    def load(cls, pair: str) -> "BuilderGains":
        return read_state(cls.path(pair), cls.from_dict, "builders' measured gains") or cls()


def _score(plan: Plan) -> float:
    return plan.predicted_tokens_per_second * (1.0 + TIE if plan.builder == "best-first" else 1.0)


def model_plans(curves, p_rank, gains: BuilderGains, measured_arms, max_tree: int, overlap_possible: bool,
                free_share: float, budgets=None, **kwargs) -> dict[str, Plan]:
    """The drafter's arms: its fastest predicted tree at MODEL_ARMS budgets (the best, and the best of
    other sizes, SPREAD apart), a hybrid of the best where it is best-first and `free_share` (the free
    drafters' share of matched text) is above HYBRID_SHARE, and every tree in `measured_arms` still
    within reach (its measurement may say it is the best). Gains applied."""
    best: dict[int, Plan] = {}
    for plan in priced_plans(curves, p_rank, overlap_possible, budgets=budgets, **kwargs):
        plan = gains.apply(plan)
        if plan.budget <= max_tree and (plan.budget not in best or _score(plan) > _score(best[plan.budget])):
            best[plan.budget] = plan
    ranked: list[Plan] = []  # a smaller or larger tree may measure faster than predicted
    for plan in sorted(best.values(), key=lambda p: -p.predicted_tokens_per_second):
        if len(ranked) < MODEL_ARMS and all(max(plan.budget, r.budget) >= SPREAD * min(plan.budget, r.budget) for r in ranked):
            ranked.append(plan)
    plans = {arm_of(p.draft_spec()): p for p in ranked}
    if free_share > HYBRID_SHARE and ranked and ranked[0].builder == "best-first":  # free proposals grown into the same search: measured, not priced,
        hybrid = gains.apply(replace(ranked[0], builder="hybrid"))  # so priced a TIE below the search it extends:
        plans[f"hybrid@{ranked[0].budget}"] = replace(hybrid, predicted_tokens_per_second=hybrid.predicted_tokens_per_second / (1 + TIE))
    for arm in measured_arms:
        if family_of(arm) == "model" and arm not in plans:
            builder, budget = arm.rsplit("@", 1)
            measured = predict(curves, p_rank, builder, int(budget), overlap_possible, **kwargs)
            if measured is not None and measured.budget <= max_tree and (budgets is None or measured.budget in budgets):
                plans[arm] = gains.apply(measured)
    return plans
