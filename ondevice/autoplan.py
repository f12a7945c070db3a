"""`--tree auto`: the hardware-aware plan for the loaded pipeline, kept current as acceptance drifts.

The profile (latency curves of this machine's target and drafter) is measured once on the models
already loaded, saved, and reused. Before each answer the plan is re-chosen from the profile and
the acceptance-by-rank vector learned so far (AcceptanceTracker), plus the per-pass overhead the
engine measured; after each answer the tracker is saved.
"""

from __future__ import annotations

from ondevice.optimizer import AcceptanceTracker, Plan, choose_plan
from ondevice.profile_store import ProfileBackends, get_profile
from ondevice.protocols import DraftSpec
from ondevice.verify import Sampling

CPU_MAX_TREE = 256  # on a CPU target the pass cost grows steeply; never worth profiling bigger trees


class AutoPlanner:
    def __init__(self, backends: ProfileBackends, show: bool = True):
        self.backends = backends
        self.profile, self.reused = get_profile(backends, show=show)
        self.tracker = AcceptanceTracker.load(backends.pair)
        self.overhead_per_pass = 0.0
        self.plan: Plan | None = None

    def choose(self) -> Plan:
        self.plan = choose_plan(
            self.profile.curves, self.tracker.p_rank, self.profile.overlap_possible, overhead_per_pass=self.overhead_per_pass
        )
        return self.plan

    def spec(self, sampling: Sampling) -> DraftSpec | None:
        return self.choose().draft_spec(temperature=sampling.temperature, seed=sampling.seed)

    def observe(self, tree, path) -> None:
        if len(tree) > 1:
            self.tracker.observe(tree, path)

    def finish(self, stats) -> None:
        """After an answer: learn the per-pass overhead and keep the acceptance estimate."""
        if stats.target_passes:
            self.overhead_per_pass = max(stats.overhead_seconds, 0.0) / stats.target_passes
        self.tracker.save(self.backends.pair)
