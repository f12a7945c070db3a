"""`--tree auto`: the hardware-aware plan for the loaded pipeline, kept current as acceptance drifts.

The profile (latency curves of this machine's target and drafter) is measured once on the models
already loaded, saved, and reused. Before each answer the plan is re-chosen from the profile and
the acceptance-by-rank vector learned so far (AcceptanceTracker), plus the per-pass overhead the
engine measured; after each answer the tracker is saved. Where model drafting does not pay, the
plan falls back to prompt lookup or the target alone (`ondevice.plan.fallback`), whichever is predicted
faster from what lookup achieved so far (LookupTracker, also saved).
"""

from __future__ import annotations

from ondevice.plan.fallback import LookupTracker, fallback_plan, replay
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.plan.cost_model import Plan, choose_plan, predict
from ondevice.plan.profile import ProfileBackends, get_profile
from ondevice.protocols import DraftSpec
from ondevice.verify import Sampling

CPU_MAX_TREE = 256  # on a CPU target the pass cost grows steeply; never worth profiling bigger trees


class AutoPlanner:
    def __init__(self, backends: ProfileBackends, show: bool = True, refresh: bool = False, compare: bool = False):
        """compare: also measure the backends not loaded (`ondevice profile`), for plan/backends.py."""
        self.backends = backends
        self.profile, self.reused = get_profile(backends, refresh=refresh, show=show, compare=compare)
        self.tracker = AcceptanceTracker.load(backends.pair)
        self.lookup = LookupTracker.load(backends.pair)
        self.overhead_per_pass = 0.0
        self.plan: Plan | None = None

    def choose(self) -> Plan:
        self.plan = choose_plan(
            self.profile.curves, self.tracker.p_rank, self.profile.overlap_possible, overhead_per_pass=self.overhead_per_pass
        )
        if self.plan.budget == 0:
            self.plan = fallback_plan(self.plan, self.profile.curves, self.lookup, self.overhead_per_pass)
        return self.plan

    def predict(self, builder: str, budget: int) -> Plan | None:
        """What the same model predicts for a fixed configuration (bench shows it next to the measurement)."""
        return predict(self.profile.curves, self.tracker.p_rank, builder, budget, self.profile.overlap_possible,
                       overhead_per_pass=self.overhead_per_pass)

    def spec(self, sampling: Sampling) -> DraftSpec | None:
        return self.choose().draft_spec(temperature=sampling.temperature, seed=sampling.seed)

    def observe(self, tree, path) -> None:
        if self.plan is not None and self.plan.builder == "lookup":
            self.lookup.observe(tree, path)  # root-only trees too: rounds without a match
        elif len(tree) > 1:
            self.tracker.observe(tree, path)

    def finish(self, stats, tokens=None) -> None:
        """After an answer: learn the per-pass overhead and keep the acceptance estimates. `tokens`
        (prompt + answer) of an answer the target decoded alone teach lookup by replay."""
        if stats.target_passes:
            self.overhead_per_pass = max(stats.overhead_seconds, 0.0) / stats.target_passes
        if tokens is not None and self.plan is not None and self.plan.budget == 0:
            replay(self.lookup, tokens, stats.prompt_tokens)
        self.tracker.save(self.backends.pair)
        self.lookup.save(self.backends.pair)
