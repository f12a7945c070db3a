"""`--tree auto`: the hardware-aware plan for the loaded pipeline, kept current as acceptance drifts.

The profile (latency curves of this machine's target and drafter) is measured once on the models
already loaded, saved, and reused. Before each answer the plan is re-chosen from the profile and
the acceptance-by-rank vector learned so far (AcceptanceTracker), plus the per-pass overhead the
engine measured; after each answer the tracker is saved. Where model drafting does not pay, the
plan falls back to prompt lookup or the target alone (`ondevice.plan.fallback`), whichever is predicted
faster from what lookup achieved so far (LookupTracker, also saved).

The target's curve is the profile's rescaled by the passes the engine times (`PassTimes`,
rescale.py): every pass is observed, and between rounds `replan` re-chooses the plan as soon as
the rescaled curve moved by more than REPLAN_CHANGE — so a target that starts streaming from disk
(or a VM that slows down) changes the plan within a few passes, inside one answer.

A target that streams from disk has its own profile (measured streaming: its key ends in "-stream").
Drafting while the target verifies (DuoDecoding, overlap.py) pays only where the guess comes true
and the two do not fight for the same cores: the planner counts the guesses that came true against
those predicted (`hit_scale`) and times overlapped rounds against their prediction
(`overlap_scale`), and stops overlapping where it does not pay.
"""

from __future__ import annotations

import numpy as np

from ondevice.plan.fallback import LookupTracker, fallback_plan, replay
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.plan.cost_model import Plan, choose_plan, predict
from ondevice.plan.hardware import Curves, LatencyCurve
from ondevice.plan.profile import ProfileBackends, get_profile
from ondevice.plan.rescale import PassTimes
from ondevice.protocols import DraftSpec
from ondevice.verify import Sampling

CPU_MAX_TREE = 256  # on a CPU target the pass cost grows steeply; never worth profiling bigger trees
REPLAN_CHANGE = 0.15  # re-plan within an answer when the target's curve moved by more than this


def upto(curve: LatencyCurve, max_tree: int) -> LatencyCurve:
    """The curve's points up to max_tree nodes (the biggest tree the buffers are sized for)."""
    keep = [i for i, n in enumerate(curve.ns) if n <= max_tree] or [0]
    return LatencyCurve(tuple(curve.ns[i] for i in keep), tuple(curve.seconds[i] for i in keep))


class AutoPlanner:
    def __init__(self, backends: ProfileBackends, show: bool = True, refresh: bool = False, compare: bool = False):
        """compare: also measure the backends not loaded (`ondevice profile`), for plan/backends.py."""
        self.backends = backends
        self.profile, self.reused = get_profile(backends, refresh=refresh, show=show, compare=compare)
        self.tracker = AcceptanceTracker.load(backends.pair)
        self.lookup = LookupTracker.load(backends.pair)
        self.overhead_per_pass = 0.0
        self.plan: Plan | None = None
        memory = getattr(backends, "memory", None)  # a ProfileBackends; tests pass lighter stand-ins
        self.streams = memory is not None and memory.streams
        self.overlap_possible = getattr(backends, "overlap_possible", self.profile.overlap_possible)  # this setup's, not the saved one's
        max_tree = getattr(backends, "max_tree", CPU_MAX_TREE)
        # a slowdown is the disk's (δ) only where the profile did not stream: one measured streaming has it in t(n)
        disk_missing = self.streams and getattr(self.profile, "target_placement", "ram") != "disk"
        self.pass_times = PassTimes(upto(self.profile.curves.target, max_tree), streams=disk_missing)
        self.guesses_hit = self.guesses_expected = 0.0  # overlap: trees drafted during a pass that were used, and predicted
        self.overlap_scale = 1.0  # overlapped rounds: measured / predicted seconds
        self._planned_curve: np.ndarray | None = None  # the target curve the current plan was chosen with
        self._sampling = Sampling()

    @property
    def curves(self) -> Curves:
        """The drafter's profiled curve and the target's, rescaled by the passes seen so far."""
        return Curves(self.pass_times.curve(), self.profile.curves.drafter)

    @property
    def hit_scale(self) -> float:
        """Measured / predicted hits of the trees drafted during passes (1 with a pass's worth of prior)."""
        return (self.guesses_hit + 1.0) / (self.guesses_expected + 1.0)

    def choose(self) -> Plan:
        curves = self.curves
        self._planned_curve = np.asarray(curves.target.seconds)
        self.plan = choose_plan(
            curves, self.tracker.p_rank, self.overlap_possible, overhead_per_pass=self.overhead_per_pass,
            hit_scale=self.hit_scale, overlap_scale=self.overlap_scale,
        )
        if self.plan.budget == 0:
            self.plan = fallback_plan(self.plan, curves, self.lookup, self.overhead_per_pass)
        return self.plan

    def predict(self, builder: str, budget: int) -> Plan | None:
        """What the same model predicts for a fixed configuration (bench shows it next to the measurement)."""
        curves = self.curves
        return predict(curves, self.tracker.p_rank, builder, budget, self.overlap_possible,
                       overhead_per_pass=self.overhead_per_pass, hit_scale=self.hit_scale, overlap_scale=self.overlap_scale)

    def spec(self, sampling: Sampling) -> DraftSpec | None:
        self._sampling = sampling
        return self.choose().draft_spec(temperature=sampling.temperature, seed=sampling.seed)

    def replan(self) -> DraftSpec | None:
        """Between two rounds of an answer: the current plan's spec, re-chosen first if the target's
        rescaled curve moved by more than REPLAN_CHANGE since it was chosen."""
        now = np.asarray(self.pass_times.curve().seconds)
        if self._planned_curve is None or np.max(np.abs(now / self._planned_curve - 1.0)) > REPLAN_CHANGE:
            self.choose()
        return self.plan.draft_spec(temperature=self._sampling.temperature, seed=self._sampling.seed)

    def observe(self, tree, path, pass_seconds: float | None = None) -> None:
        """One verified round: its tree, the accepted path, and how long the target's pass took."""
        if pass_seconds is not None:
            self.pass_times.observe(len(tree), pass_seconds)
        if self.plan is not None and self.plan.builder == "lookup":
            self.lookup.observe(tree, path)  # root-only trees too: rounds without a match
        elif len(tree) > 1:
            self.tracker.observe(tree, path)

    def finish(self, stats, tokens=None) -> None:
        """After an answer: learn the per-pass overhead and keep the acceptance estimates. `tokens`
        (prompt + answer) of an answer the target decoded alone teach lookup by replay."""
        if stats.target_passes:
            self.overhead_per_pass = max(stats.overhead_seconds, 0.0) / stats.target_passes
        prepared = getattr(stats, "prepared_trees", 0)  # engine Stats; tests pass lighter stand-ins
        if prepared and self.plan is not None and self.plan.overlap:  # what overlapping achieved
            self.guesses_hit += stats.overlap_hits
            self.guesses_expected += prepared * self.plan.hit_rate
            predicted = self.plan.predicted_tokens_per_pass / self.plan.predicted_tokens_per_second  # seconds per round
            measured = stats.decode_seconds / stats.target_passes
            self.overlap_scale *= measured / predicted
        if tokens is not None and self.plan is not None and self.plan.budget == 0:
            replay(self.lookup, tokens, stats.prompt_tokens)
        self.tracker.save(self.backends.pair)
        self.lookup.save(self.backends.pair)
