"""The planner's fallback when model drafting does not pay: prompt lookup or the target alone,
chosen from what lookup achieved (LookupTracker), learned online and by replaying target-only answers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ondevice.decode.engine import RoundReport
from ondevice.plan import auto as autoplan
from ondevice.plan.arms import arm_of
from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.plan.fallback import LookupTracker, fallback_plan, follow, lookup_plan, replay
from ondevice.plan.curve import Curves, LatencyCurve, powers_of_two
from ondevice.plan.acceptance import default_p_rank
from ondevice.plan.cost_model import choose_plan
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling


# --- the fallback choice ----------------------------------------------------------------------
def curve(points: dict[int, float]) -> LatencyCurve:
    return LatencyCurve(tuple(points), tuple(points.values()))


CPU_TARGET = curve({1: 0.087, 2: 0.129, 4: 0.180, 8: 0.264, 16: 0.275, 32: 0.391, 64: 0.658})  # profiled here, 1.5B
CPU_DRAFTER = curve({1: 0.039, 2: 0.042, 4: 0.056, 8: 0.084, 16: 0.129, 32: 0.231, 64: 0.419})
SLOW_DRAFTER = curve({1: 0.120, 64: 0.900})


def learned(match: float, accept: float, rounds: int = 400) -> LookupTracker:
    """A tracker that saw `rounds` lookup rounds of budget 6: `match` of them drafted, each level
    accepted with probability `accept` (decay off)."""
    tracker = LookupTracker(decay=1.0)
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        if rng.random() >= match:
            tracker.observe_round(False, 0, 0)
            continue
        accepted = 0
        while accepted < 6 and rng.random() < accept:
            accepted += 1
        tracker.observe_round(True, min(accepted + 1, 6), accepted)
    return tracker


def test_tracker_counts_levels_at_risk():
    tree = DraftTree.chain(0, [1, 2, 3])
    tracker = LookupTracker(prior_weight=0.0, decay=1.0)
    tracker.observe(tree, [0, 1, 2])  # two accepted, the third level rejected
    tracker.observe(tree, [0, 1, 2, 3])  # all three accepted: the leaf risks nothing
    tracker.observe(DraftTree.root_only(0), [0])  # no match
    assert (tracker.tokens, tracker.matched_tokens, tracker.at_risk, tracker.accepted) == (8, 7, 6, 5)
    assert tracker.share == pytest.approx(7 / 8) and tracker.acceptance == pytest.approx(5 / 6)
    # at budget k, a matched round emits E_k tokens: the match rate that makes 7/8 of the tokens
    e = tracker.matched_tokens_per_pass(2)
    assert e == pytest.approx(1 + 5 / 6 + (5 / 6) ** 2)
    m = tracker.match_rate(2)
    assert m * e / (m * e + 1 - m) == pytest.approx(7 / 8)


def test_fresh_prior_keeps_the_target_alone_on_a_steep_cpu_curve():
    plan = choose_plan(Curves(CPU_TARGET, SLOW_DRAFTER), default_p_rank(), overlap_possible=False)
    assert plan.budget == 0
    plan = fallback_plan(plan, Curves(CPU_TARGET, SLOW_DRAFTER), LookupTracker())
    assert plan.builder == "target-only" and plan.draft_spec() is None
    assert plan.fallback_reason.startswith("the drafter is slower") and "using the target alone" in plan.fallback_reason


def test_high_measured_acceptance_falls_back_to_lookup():
    curves = Curves(CPU_TARGET, SLOW_DRAFTER)
    tracker = learned(match=0.7, accept=0.9)
    plan = fallback_plan(choose_plan(curves, default_p_rank(), overlap_possible=False), curves, tracker)
    assert plan.builder == "lookup" and plan.budget >= 2 and "using prompt lookup" in plan.fallback_reason
    assert plan.draft_spec(temperature=0.0) == DraftSpec("lookup", plan.budget)
    # the prediction, from the definition: E = m(1 + a + … + a^k) + 1 − m over the mixed pass time
    a, k = tracker.acceptance, plan.budget
    m = tracker.match_rate(k)
    e = m * sum(a**i for i in range(k + 1)) + 1 - m
    seconds = m * CPU_TARGET(k + 1) + (1 - m) * CPU_TARGET(1)
    assert plan.predicted_tokens_per_second == pytest.approx(e / seconds)
    assert plan.predicted_speedup > 1.5


@pytest.mark.parametrize("match, accept", [(0.9, 0.3), (0.5, 0.4)])
def test_low_acceptance_keeps_the_target_alone(match, accept):
    curves = Curves(CPU_TARGET, SLOW_DRAFTER)
    plan = fallback_plan(choose_plan(curves, default_p_rank(), overlap_possible=False), curves, learned(match, accept))
    assert plan.builder == "target-only" and plan.budget == 0
    assert "using the target alone (prompt lookup:" in plan.fallback_reason


def test_rare_matches_that_run_long_still_pay():
    curves = Curves(CPU_TARGET, SLOW_DRAFTER)  # a round without a match costs a plain step: only matches pay
    plan = fallback_plan(choose_plan(curves, default_p_rank(), overlap_possible=False), curves, learned(0.1, 0.95))
    assert plan.builder == "lookup" and plan.budget >= 8


def test_lookup_never_loses_on_a_flat_curve():
    flat = curve({n: 1.5 for n in powers_of_two(64)})
    plan = lookup_plan(Curves(flat, CPU_DRAFTER), LookupTracker())
    assert plan.budget == 16 and plan.predicted_speedup > 1.0  # a bigger pass is free: draft all you can


# --- learning by replay -----------------------------------------------------------------------
SNIPPET = [int(t) for t in np.random.default_rng(5).integers(0, 5000, 120)]


def test_follow_walks_the_accepted_path():
    tree = PromptLookupDrafter(n_vocab=400).draft([1, 2, 3, 4, 80, 1, 2, 3, 5, 81, 1, 2], DraftSpec("lookup", 6))
    assert [int(tree.tokens[n]) for n in follow(tree, [3, 4, 80, 99])] == [2, 3, 4, 80]
    assert follow(tree, [7]) == [0]


def test_replay_learns_copying_and_not_prose():
    copying = LookupTracker(decay=1.0)
    replay(copying, SNIPPET + [7000, 7001] + SNIPPET, start=len(SNIPPET) + 2)
    assert copying.matched_tokens / copying.tokens > 0.9 and copying.accepted / copying.at_risk > 0.95
    fresh = LookupTracker(decay=1.0)
    other = [int(t) for t in np.random.default_rng(6).integers(0, 5000, 120)]
    replay(fresh, SNIPPET + other, start=len(SNIPPET))
    assert fresh.share < LookupTracker().share and fresh.tokens > 50


def test_planner_replays_target_only_answers_then_switches_to_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    profile = SimpleNamespace(curves=Curves(CPU_TARGET, SLOW_DRAFTER), overlap_possible=False)
    monkeypatch.setattr(autoplan, "saved_profile", lambda backends: profile)
    planner = autoplan.AutoPlanner(SimpleNamespace(pair="toy", make_decode_batch=lambda: None))
    assert arm_of(planner.spec(Sampling())) == "target" and "using the target alone" in planner.plan.fallback_reason
    prompt = SNIPPET + [7000, 7001]
    for _ in range(3):  # three answers that copy the prompt's code, decoded by the target alone
        stats = SimpleNamespace(target_passes=120, overhead_seconds=0.0, prompt_tokens=len(prompt))
        planner.finish(stats, prompt + SNIPPET)
    spec = planner.spec(Sampling())
    assert spec is not None and spec.builder == "lookup" and "using prompt lookup" in planner.plan.fallback_reason
    planner.observe(RoundReport(DraftTree.root_only(1), [0], spec, 0.09, 0.1, len(prompt)))  # lookup rounds now teach the lookup tracker
    assert planner.free["lookup"].tokens > 0 and planner.tracker.at_risk.sum() == 0
    saved = autoplan.AutoPlanner(SimpleNamespace(pair="toy", make_decode_batch=lambda: None)).free["lookup"]  # what the last answer left
    assert saved.tokens > 100 and saved.acceptance > 0.9
