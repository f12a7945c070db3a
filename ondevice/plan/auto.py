"""`--tree auto`: the planner a pipeline consults before every round — it predicts, measures, and
believes what it measures.

Predictions come from the cost model (cost_model.py: the profile's latency curves, rescaled online
by the passes the engine times, rescale.py; acceptance by rank learned so far, acceptance.py;
prompt lookup's match share and acceptance, fallback.py). They price the *arms* this pipeline can
run — the target alone, prompt lookup, and the drafter model's best trees at a few budgets — and
arms.py turns predictions and measurements into the arm each round runs: the one measured (or,
unmeasured, predicted) fastest, with a bounded share of rounds auditing a runner-up that might be
faster. Every round is timed and booked to its arm; the book is saved per regime (machine, pair,
backends, in RAM or streamed) and reloaded at half weight, so a wrong profile costs one answer,
not every later run.

No profile yet: the planner does not wait for one. The target alone answers (and prompt lookup,
priced on a provisional curve: a pass of n tokens costs n single passes, as on a CPU in RAM) while
`idle_step` measures the profile one sample at a time whenever the caller is idle (a chat between
answers, while its user reads or types); the drafter's trees become arms once it is measured. A
profile found busy (timing.py: other processes disturbed it) is used, and measured again the same
way. `ondevice profile` measures everything on demand. Where the target is on a GPU
(`ProfileBackends.profile_first`) the profile is measured before the first answer: seconds there.

A target that streams from disk has its own profile (loading/profiling.streaming_profile). Drafting while
the target verifies (decode/overlap.py) is priced with what overlapped rounds achieved (`hit_scale`, `overlap_scale`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from ondevice.draft.suffix_drafter import SuffixDrafter
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.plan.arms import Price, arm_of, family_of, load_book, save_book
from ondevice.plan.cost_model import Plan, longest_round, predict
from ondevice.plan.curve import Curves, LatencyCurve, provisional_curve, upto
from ondevice.plan.fallback import MAX_LOOKUP_BUDGET, LookupTracker, lookup_plan, replay
from ondevice.plan.idle_profile import IdleProfiler
from ondevice.plan.latency import ALONE_CONTEXT
from ondevice.plan.model_arms import BuilderGains, model_plans
from ondevice.plan.profile import Profile, get_profile, saved_profile
from ondevice.plan.rescale import PassTimes, context_growth
from ondevice.decode.protocols import TARGET_FREE, DraftSpec
from ondevice.decode.verify import Sampling

CPU_MAX_TREE = 256  # on a CPU target the pass cost grows steeply; never worth profiling bigger trees
REPLAN_CHANGE = 0.15  # re-price the target alone and lookup when the target's curve moved by more than this ...
MIN_REPRICE_ROUNDS = 4  # ... checked this often (one noisy pass moves a fresh bucket; the check costs ~0.3 ms)
JUMP = 2.0  # re-price everything at once when it moved by this factor (the target started or stopped streaming),
JUMP_PASSES = 2  # ... that many passes in a row (one pass can be another process's doing),
SETTLE_ROUNDS = 3  # re-pricing after each of the next rounds while the curve learns the new regime
REPRICE_ROUNDS = 256  # the drafter's trees are re-priced this often (~30 ms each time), and before every answer
FREE_ARMS = ("lookup", "suffix", "recycle")  # drafters that cost no model time (draft/router.py)
REPLAYED = ("lookup", "suffix")  # ... whose records learn from every answer (replay), whatever decoded it
FRESH_PASSES = 16  # pass times this recent bound what the target alone could do (_target_floor)


def regime_of(backends) -> str:
    """What measured rates depend on besides the machine and the pair: backends, in RAM or streamed,
    with or without the drafter model (the free drafters only: "none")."""
    drafter = backends.drafter_name if getattr(backends, "make_decode_batch", None) is not None else "none"
    return f"{backends.profile_key}-{backends.target_name}-{drafter}"


class AutoPlanner:
    def __init__(self, backends, show: bool = True, refresh: bool = False, compare: bool = False, measure_now: bool | None = None):
        """measure_now: measure a missing profile before returning (default: with refresh or compare,
        i.e. `ondevice profile`, or where the backends say so: a GPU target)."""
        self.backends = backends
        if measure_now is None:
            measure_now = refresh or compare or getattr(backends, "profile_first", False)
        if measure_now:
            self.profile, self.reused = get_profile(backends, refresh=refresh, show=show, compare=compare)
        else:
            self.profile, self.reused = saved_profile(backends), True
        self.tracker = AcceptanceTracker.load(backends.pair)
        self.gains = BuilderGains.load(backends.pair)  # what each builder's trees accept beyond the rank model
        self.free = {builder: LookupTracker.load(backends.pair, builder) for builder in FREE_ARMS}  # what each free drafter achieved
        memory = getattr(backends, "memory", None)  # a ProfileBackends; tests pass lighter stand-ins
        self.streams = memory is not None and memory.streams
        saved_overlap = getattr(self.profile, "overlap_possible", False)
        self.overlap_possible = getattr(backends, "overlap_possible", saved_overlap)  # this setup's, not the saved one's
        self.max_tree = getattr(backends, "max_tree", CPU_MAX_TREE)
        files = getattr(backends, "model_files", None)
        self.growth = context_growth(files[0][0]) if files else 0.0
        self.has_drafter = getattr(backends, "make_decode_batch", None) is not None
        self.lean_curve = getattr(backends, "lean_curve", None)  # no profile, no drafter: the target's passes timed at load
        self.regime = regime_of(backends) if hasattr(backends, "profile_key") else "default"
        self.book = load_book(backends.pair, self.regime, getattr(backends, "yardstick", None))
        self.overhead_per_pass = 0.0
        self.guesses_hit = self.guesses_expected = 0.0  # overlap: trees drafted during a pass that were used, and predicted
        self.overlap_scale = 1.0  # overlapped rounds: measured / predicted seconds
        self.fixed_budget: int | None = None  # --budget with --tree auto: the drafter's trees at this budget only
        self._sampling = Sampling()
        self.idle = IdleProfiler(self)  # the profile measured between answers (idle_step)
        self._start_pass_times()
        self.context = 0  # tokens cached before the next pass
        self.plans: dict[str, Plan] = {}  # the arms' plans (how to draft them), priced by `price`
        self.prices: dict[str, Price] = {}
        self.plan: Plan | None = None  # the incumbent's
        self.playing: str = "target"  # the arm of the next round
        self.auditing = False
        self._last_family: str | None = None  # the previous round's, in this answer
        self._drafter_lag = 1  # tokens the drafter model's cache lacks (it catches up before drafting)
        self.answer_tokens_by_arm: Counter = Counter()
        self._rounds_since_price = self._rounds_since_trees = 0
        self._jumped = False  # JUMP_PASSES passes in a row came out JUMP times off their priced time
        self._off = 0  # passes in a row off that way (+ slower, − faster)
        self._regime_start = 0  # pass count when the last jump's passes began
        self._settling = 0  # rounds left to re-price every round after a jump
        self._priced_curve: np.ndarray | None = None
        self._free_pass_seconds: tuple[float, ...] = ()  # a sized round's pass seconds over 1 … cap + 1 tokens

    # --- curves -------------------------------------------------------------------------------------
    def _start_pass_times(self) -> None:
        if self.profile is not None:
            base = upto(self.profile.curves.target, self.max_tree)
            # a slowdown is the disk's (δ) only where the profile did not stream: one measured streaming has it in t(n)
            disk_missing = self.streams and getattr(self.profile, "target_placement", "ram") != "disk"
            context = getattr(self.profile, "target_context", 64)
        elif self.lean_curve is not None:  # timed as it streams, over the profile's context
            base, disk_missing, context = upto(self.lean_curve, self.max_tree), False, ALONE_CONTEXT
        else:
            base, disk_missing, context = provisional_curve(self.max_tree), False, 0
        self.pass_times = PassTimes(base, streams=disk_missing, growth=self.growth, base_context=context)

    def _curve_measured(self) -> bool:
        """Whether the target's curve was measured (the profile's, or a drafter-less load's timed at
        load): free rounds are sized only on such a curve. On the provisional one (n tokens cost n
        passes) no round would draft, and the passes that could teach it otherwise (the free arms'
        fixed trees) would not run; a line fitted online to the passes of 1 and 2 tokens that do run
        drafted nothing on one run of two (a streamed pass's time is not a line:
        docs/measurements/2026-11-28-drafter-less-sized.md)."""
        return self.profile is not None or self.lean_curve is not None

    @property
    def curves(self) -> Curves | None:
        """The drafter's profiled curve and the target's, rescaled by the passes seen so far (None:
        no profile yet)."""
        if self.profile is None:
            return None
        return Curves(self.pass_times.curve(self.context), self.profile.curves.drafter)

    @property
    def hit_scale(self) -> float:
        """Measured / predicted hits of the trees drafted during passes (1 with a pass's worth of prior)."""
        return (self.guesses_hit + 1.0) / (self.guesses_expected + 1.0)

    # --- pricing the arms -----------------------------------------------------------------------------
    def price(self, trees: bool = True) -> None:
        """Predict every arm's speed from the current curves and acceptance (the closed loop's priors).
        trees=False keeps the drafter's trees as last priced (pricing them takes ~30 ms)."""
        target_curve = self.pass_times.curve(self.context)
        self._priced_curve, self._rounds_since_price = np.asarray(target_curve.seconds), 0
        # free rounds are sized only on a measured curve (until then the free arms' fixed trees teach it)
        cap = max(1, min(self.fixed_budget or MAX_LOOKUP_BUDGET, self.max_tree - 1))  # a sized round's nodes at most
        self._free_pass_seconds = tuple(float(target_curve(k)) + self.overhead_per_pass for k in range(1, cap + 2)) \
            if self._curve_measured() else ()
        known = self._curve_measured() or self.pass_times.passes > 0  # a provisional curve needs one pass
        t1 = target_curve(1) + self.overhead_per_pass
        alone = Plan("target-only", 0, 0, 1.0, 1.0 / t1, 1.0 / t1, False)
        plans = {"target": alone}
        free = [lookup_plan(Curves(target_curve, target_curve), tracker, self.overhead_per_pass, builder=builder)
                for builder, tracker in self.free.items()] if known else []
        free = [(self.book.spt(plan.builder, 1.0 / plan.predicted_tokens_per_second), plan) for plan in free if plan is not None]
        if free:  # the best free drafter only: on prose all of them tie with the target alone, and auditing each cost 2-4%
            plans[min(free, key=lambda x: x[0])[1].builder] = min(free, key=lambda x: x[0])[1]
        if not trees:
            plans.update({arm: plan for arm, plan in self.plans.items() if family_of(arm) == "model"})
        else:
            self._rounds_since_trees = 0
            if self.profile is not None and self.has_drafter:
                plans.update(self._model_plans())
        self.plans = plans
        curves = Curves(target_curve, self.profile.curves.drafter) if self.profile is not None else None  # = self.curves, fitted once
        longest = {arm: longest_round(curves, plan.budget, self.overhead_per_pass)  # a tree's longest round: what its audit is budgeted at
                   for arm, plan in plans.items() if curves is not None and family_of(arm) == "model"}
        self.prices = {arm: _price(plan, self._pass_part(arm, plan, target_curve), longest.get(arm)) if known else Price(None)
                       for arm, plan in plans.items()}
        if known:
            self.prices["target"] = replace(self.prices["target"], floor=self._target_floor())
        self._set_incumbent()

    def _pass_part(self, arm: str, plan: Plan, curve: LatencyCurve) -> float:
        """The target pass's share of a predicted round of `arm` (what PassTimes learns, not the arm)."""
        if arm in self.free:
            m = self.free[arm].match_rate(plan.budget)
            return m * curve(plan.budget + 1) + (1 - m) * curve(1)
        return curve(plan.budget + 1)

    def _target_floor(self) -> float | None:
        """The fastest a single-token pass could be: a pass of n tokens never costs less than one of
        1 (so a measured n-pass bounds it from above), and one pass of n costs at most n of 1, so
        t(1) ≥ t(n)/n for every size n measured. Where the target streams, a pass reads the same
        bytes whatever its size, so t(1) ≥ the fastest pass measured. Where only trees ran, the
        target alone may be far faster than a curve measured on a busy machine says (plan/arms.py
        uses this floor)."""
        since_jump = self.pass_times.passes - self._regime_start  # older passes ran in another regime
        measured = self.pass_times.measured(within=min(FRESH_PASSES, since_jump))
        if not measured or 1 in measured:
            return None
        per_token = (seconds / (1 if self.streams else n) for n, seconds in measured.items())
        return min(per_token) + self.overhead_per_pass

    def choose(self) -> Plan:
        """Price the arms now; the incumbent's plan (what the next round runs unless it audits)."""
        self.price()
        return self.plan

    def _model_plans(self) -> dict[str, Plan]:
        """The drafter's trees the closed loop weighs (model_arms.py), at --budget only if one was given."""
        budgets = None if self.fixed_budget is None else [self.fixed_budget]
        free_share = max(self.free[builder].share for builder in REPLAYED)
        return model_plans(self.curves, self.tracker.p_rank, self.gains, self.book.arms, self.max_tree, self.overlap_possible,
                           free_share, budgets=budgets, overhead_per_pass=self.overhead_per_pass, hit_scale=self.hit_scale,
                           overlap_scale=self.overlap_scale)

    def _set_incumbent(self) -> None:
        ranked = self.book.leading(self.prices)
        arm = ranked[0][0] if ranked else "target"
        self.plan = replace(self.plans[arm], fallback_reason=self._reason(arm)) if family_of(arm) != "model" else self.plans[arm]

    def _reason(self, arm: str) -> str:
        """Why the drafter model is not the incumbent, in numbers."""
        names = {"target": "the target alone", "lookup": "prompt lookup", "suffix": "suffix drafting", "recycle": "token recycling"}
        what = names[arm] + ("" if arm == "target" else f" @{self.plans[arm].budget}")
        if not self.has_drafter:
            return f"using {what}; the drafter model is not loaded"
        if self.profile is None:
            return f"no profile yet: {what} answers while the drafter's latency is measured (`ondevice profile` measures it now)"
        model = [(a, s) for a, s in self.book.ranked(self.prices) if family_of(a) == "model"]
        if not model:
            return f"using {what}; no tree of the drafter fits this target's measured curve"
        best_tree, spt = model[0]
        measured = self.book.arms.get(best_tree)
        how = "measured" if measured is not None and measured.tokens >= 1 else "predicted"
        return f"using {what}: the best tree, {best_tree}, is {how} at {1 / spt:.1f} tok/s against {self.tokens_per_second(arm):.1f}"

    def tokens_per_second(self, arm: str) -> float:
        spt = self.book.spt(arm, self.prices.get(arm, Price(None)).spt)
        return 1.0 / spt if spt else 0.0

    # --- one answer ---------------------------------------------------------------------------------
    def spec(self, sampling: Sampling, context: int = 0, budget: int | None = None) -> DraftSpec | None:
        """The first round's spec of an answer whose prompt holds `context` tokens (budget: --budget)."""
        self._sampling, self.context, self.fixed_budget = sampling, context, budget
        self._last_family, self.answer_tokens_by_arm, self._drafter_lag = None, Counter(), max(1, context)
        self.price()
        return self._next_spec()

    def replan(self) -> DraftSpec | None:
        """Between two rounds of an answer: the next round's spec, re-priced first when the target's
        rescaled curve moved by JUMP (all arms), or by REPLAN_CHANGE after MIN_REPRICE_ROUNDS rounds
        (the target alone and lookup), and the trees every REPRICE_ROUNDS rounds."""
        if self._jumped:  # another regime (the target started or stopped streaming):
            self.book.audit_regret = 0.0  # what audits cost then is sunk: the new regime needs checking
            # (what the arms measured is kept: a profile that was wrong from the start shows as jumps at
            # every pass size it got wrong, and forgetting the measurements each time undid the loop)
            self._jumped, self._off, self._settling = False, 0, SETTLE_ROUNDS
            self._regime_start = self.pass_times.passes - JUMP_PASSES
            self.price()
        elif self._settling:  # the curve is learning the new regime: re-price as it does
            self._settling -= 1
            self.price(trees=self._settling == 0)
        elif not self.prices.get("target", Price(None)).spt or self._rounds_since_trees >= REPRICE_ROUNDS:
            self.price()
        elif self._rounds_since_price >= MIN_REPRICE_ROUNDS:
            now = np.asarray(self.pass_times.curve(self.context).seconds)
            same_sizes = self._priced_curve is not None and len(now) == len(self._priced_curve)
            if not same_sizes or np.max(np.abs(np.log(now / self._priced_curve))) > np.log1p(REPLAN_CHANGE):
                self.price(trees=False)
            self._rounds_since_price = 0
        target = self.prices.get("target")
        if target is not None and target.spt:  # cheap, and what it bounds changes with every pass seen
            self.prices["target"] = replace(target, floor=self._target_floor())
        return self._next_spec()

    def _next_spec(self) -> DraftSpec | None:
        self.playing, self.auditing = self.book.next_arm(self.prices, switch_cost=self._switch_cost)
        plan = self.plans.get(self.playing, self.plans["target"])
        spec = plan.draft_spec(temperature=self._sampling.temperature, seed=self._sampling.seed)
        if not self._free_pass_seconds or (spec is not None and self.playing not in self.free):
            return spec  # a tree of the drafter model (or nothing priced yet)
        if spec is None:  # the target alone: with the free drafts that pay for its pass (draft/sizing.py)
            spec = DraftSpec(TARGET_FREE, 0, temperature=self._sampling.temperature, seed=self._sampling.seed)
        return replace(spec, budget=len(self._free_pass_seconds) - 1, pass_seconds=self._free_pass_seconds)

    def _switch_cost(self, arm: str) -> float:
        """Seconds to start drafting with the model mid-answer: its cache catches up on the tokens
        it did not see (`_drafter_lag`: since it last drafted; the whole prompt if not in this answer)."""
        if family_of(arm) != "model" or self._last_family == "model" or self.profile is None:
            return 0.0  # (at an answer's start the drafter catches up on the whole prompt: `_drafter_lag`)
        return self.profile.curves.drafter(self._drafter_lag)  # beyond the curve: its last slope

    @property
    def answer_tokens(self) -> int:
        return int(sum(self.answer_tokens_by_arm.values()))

    def observe(self, report) -> None:
        """One verified round (engine.RoundReport): learn acceptance, pass time and the arm's speed."""
        arm = arm_of(report.spec)
        n = len(report.tree)
        if self._priced_curve is not None and self.pass_times.passes:
            expected = self.pass_times.base.ns.index(self.pass_times.bucket_of(n))
            ratio = report.pass_seconds / self.pass_times.context_factor(report.context) / self._priced_curve[expected]
            side = 1 if ratio >= JUMP else -1 if ratio <= 1 / JUMP else 0
            self._off = self._off + side if side and np.sign(self._off) in (0, side) else side  # consecutive passes off, same way
            self._jumped |= abs(self._off) >= JUMP_PASSES
        self.pass_times.observe(n, report.pass_seconds, report.context)
        if arm in self.free:
            self.free[arm].observe(report.tree, report.path)  # root-only trees too: rounds without a match
        elif report.spec is not None and report.spec.builder in ("chain", "best-first", "multi-seq") and len(report.tree) > 1:
            self.tracker.observe(report.tree, report.path)  # the drafter's own ranks (hybrid trees hold free nodes too)
        plan = self.plans.get(arm)
        if family_of(arm) == "model" and plan is not None and plan.shape_tokens_per_pass is not None:
            self.gains.observe(plan.builder, plan.shape_tokens_per_pass - 1.0, len(report.path) - 1)
        switch = family_of(arm) == "model" and self._last_family not in (None, "model")  # the drafter caught up first
        price = self.prices.get(arm, Price(None))
        # a sized round of the target alone that drafted: its pass is not the 1-token pass priced (what the
        # drafts saved against that price is the arm's to learn, not the curve's)
        predicted = price.spt if arm == "target" and n > 1 else price.after_pass(report.pass_seconds)
        first_tree = family_of(arm) == "model" and self._last_family is None  # the answer's first round: the family's (arms.py)
        self.book.observe(arm, len(report.path), report.round_seconds, predicted, self.auditing and arm == self.playing,
                          self.book.incumbent_spt, switch, own=not first_tree, pass_seconds=report.pass_seconds)
        self._last_family = family_of(arm)
        self._drafter_lag = 1 if family_of(arm) == "model" else self._drafter_lag + len(report.path)
        self.context = report.context + len(report.path)
        self.answer_tokens_by_arm[arm] += len(report.path)
        self._rounds_since_price += 1
        self._rounds_since_trees += 1

    def finish(self, stats, tokens=None) -> None:
        """After an answer: learn the per-pass overhead and keep what was learned. `tokens` (prompt +
        answer) of an answer mostly decoded otherwise teach lookup and suffix drafting by replay (free;
        token recycling needs the target's logits, so it learns from its own rounds only)."""
        if stats.target_passes:
            self.overhead_per_pass = max(stats.overhead_seconds, 0.0) / stats.target_passes
        prepared = getattr(stats, "prepared_trees", 0)  # engine Stats; tests pass lighter stand-ins
        if prepared and self.plan is not None and self.plan.overlap and stats.target_passes:  # what overlapping achieved
            self.guesses_hit += stats.overlap_hits
            self.guesses_expected += prepared * self.plan.hit_rate
            predicted = self.plan.predicted_tokens_per_pass / self.plan.predicted_tokens_per_second  # seconds per round
            measured = stats.decode_seconds / stats.target_passes
            self.overlap_scale *= measured / predicted
        for builder, drafter in zip(REPLAYED, (None, SuffixDrafter(0))):
            if tokens is not None and self.answer_tokens_by_arm[builder] <= 0.5 * self.answer_tokens:
                replay(self.free[builder], tokens, stats.prompt_tokens, drafter=drafter)
        self.tracker.save(self.backends.pair)
        self.gains.save(self.backends.pair)
        for builder, tracker in self.free.items():
            tracker.save(self.backends.pair, builder)
        save_book(self.book, self.backends.pair, self.regime)

    def predict(self, builder: str, budget: int) -> Plan | None:
        """What the cost model predicts for a fixed configuration (bench shows it beside the measurement)."""
        if self.profile is None:
            return None
        plan = predict(self.curves, self.tracker.p_rank, builder, budget, self.overlap_possible, overhead_per_pass=self.overhead_per_pass,
                       hit_scale=self.hit_scale, overlap_scale=self.overlap_scale)
        return None if plan is None else self.gains.apply(plan)

    # --- what it knows ----------------------------------------------------------------------------------
    def summary(self) -> dict:
        """The incumbent and the runner-up, measured and predicted; how much went to audits."""
        ranked = self.book.leading(self.prices)
        arms = [self._arm_summary(a) for a, _ in ranked[:2]]
        return {"arm": arms[0] if arms else None, "runner_up": arms[1] if len(arms) > 1 else None,
                "answer_tokens_by_arm": dict(self.answer_tokens_by_arm), "profile": self.profile_state,
                "audit_share": self.book.audit_regret / self.book.decode_seconds if self.book.decode_seconds else 0.0}

    def _arm_summary(self, arm: str) -> dict:
        tally = self.book.arms.get(arm)
        measured = 1.0 / tally.spt if tally is not None and tally.spt else None
        predicted = self.prices[arm].spt
        return {"name": arm, "estimated_tokens_per_second": self.tokens_per_second(arm), "measured_tokens_per_second": measured,
                "measured_tokens": tally.tokens if tally else 0.0, "predicted_tokens_per_second": 1.0 / predicted if predicted else None}

    @property
    def profile_state(self) -> str:
        if self.profile is None and self.lean_curve is None:
            return "measuring" if self.idle.job is not None else "none"
        return "busy" if self.profile is not None and self.profile.busy else "measured"  # (a drafter-less load's: timed at load)

    # --- measuring while idle (plan/idle_profile.py) ------------------------------------------------------
    def idle_step(self) -> bool:
        """Measure one sample of the profile while the caller has nothing else to do; False when
        there is nothing (left) to measure."""
        return self.idle.step()

    def install(self, profile: Profile) -> None:
        """Plan with this profile from now on."""
        self.profile = profile
        self._start_pass_times()
        self.price()


def _price(plan: Plan, pass_seconds: float, longest: float | None = None) -> Price:
    tps = plan.predicted_tokens_per_second
    return Price(1.0 / tps, plan.predicted_tokens_per_pass / tps, pass_seconds=pass_seconds, longest_round=longest) if tps > 0 else Price(None)
