"""The planner's closed loop (plan/arms.py, plan/auto.py): it believes what it measures.

Synthetic arms with known true speeds, whose predictions are wrong by 2x in either direction: the
loop must switch to the truly fastest arm within a stated number of rounds and keep the audits'
cost within EXPLORE_SHARE. Then the whole planner with a profile poisoned as one busy minute
poisoned a real one (docs/design/how-it-decides.md): it must end up on the target alone within one
answer of ~100 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

from ondevice.decode.engine import RoundReport
from ondevice.plan import auto as autoplan
from ondevice.plan.arms import AUDIT_ROUNDS, EXPLORE_SHARE, ArmBook, Price, Tally, arm_of, family_of, load_book, save_book
from ondevice.plan.curve import Curves, LatencyCurve
from ondevice.decode.protocols import FREE_BUILDERS as FREE, TARGET_FREE, DraftSpec
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling


@dataclass
class TrueArm:
    spt: float  # seconds per token, the truth
    tokens: int  # per round


def simulate(arms: dict[str, TrueArm], predicted: dict[str, float], rounds: int, book: ArmBook | None = None):
    """Run the policy for `rounds` rounds against the true arms; (book, arms played in order, seconds, tokens)."""
    book = book or ArmBook()
    prices = {a: Price(p, p * arms[a].tokens) for a, p in predicted.items()}
    played, seconds, tokens = [], 0.0, 0
    for _ in range(rounds):
        arm, audit = book.next_arm(prices)
        ranked = book.ranked(prices)
        truth = arms[arm]
        book.observe(arm, truth.tokens, truth.spt * truth.tokens, prices[arm].spt, audit, ranked[0][1])
        played.append(arm)
        seconds += truth.spt * truth.tokens
        tokens += truth.tokens
    return book, played, seconds, tokens


def first_settled(played: list[str], arm: str, run: int = 10) -> int:
    """The round from which `arm` is played at least `run` rounds in a row."""
    for i in range(len(played) - run + 1):
        if all(a == arm for a in played[i : i + run]):
            return i
    raise AssertionError(f"{arm} never settled: {played[-40:]}")


# The stated bound: a 2x misprediction is corrected within this many rounds. The first audit waits
# until the decode time covers its budget, MIN_AUDIT_REGRET / EXPLORE_SHARE ≈ 8 blocks of the
# runner-up's rounds; one block then settles it. With rounds of the runner-up costing up to ~2x the
# incumbent's, that is within 60 rounds.
SETTLE_ROUNDS = 60


def test_an_incumbent_predicted_twice_too_fast_is_dropped():
    """A tree predicted at 2x its true speed leads at first; the target alone, predicted 2x too
    slow, is audited and takes over (a profile measured on a busy minute)."""
    arms = {"target": TrueArm(0.030, 1), "best-first@15": TrueArm(0.055, 3)}
    book, played, _, _ = simulate(arms, {"target": 0.060, "best-first@15": 0.0275}, 200)
    assert played[0] == "best-first@15"
    assert first_settled(played, "target") <= SETTLE_ROUNDS
    assert played[-50:].count("target") >= 45


def test_a_runner_up_predicted_twice_too_slow_is_found():
    arms = {"target": TrueArm(0.030, 1), "lookup": TrueArm(0.018, 2)}
    _, played, _, _ = simulate(arms, {"target": 0.030, "lookup": 0.036}, 300)
    assert played[0] == "target"
    assert first_settled(played, "lookup") <= SETTLE_ROUNDS
    assert played[-50:].count("lookup") >= 45


def test_right_predictions_need_no_switch():
    arms = {"target": TrueArm(0.030, 1), "chain@3": TrueArm(0.045, 2)}
    _, played, _, _ = simulate(arms, {"target": 0.030, "chain@3": 0.045}, 300)
    assert played.count("target") >= 290  # the runner-up is never hopeful enough to run much


@pytest.mark.parametrize("tokens", [1, 4])
def test_audits_cost_at_most_their_share(tokens):
    """A runner-up predicted right at the incumbent's speed but truly half as fast keeps looking
    worth a check as its measurements fade: over a long run the time lost to it stays within
    EXPLORE_SHARE (plus one block)."""
    arms = {"target": TrueArm(0.030, 1), "chain@3": TrueArm(0.060, tokens)}
    book, played, seconds, emitted = simulate(arms, {"target": 0.030, "chain@3": 0.029}, 4000)
    best = emitted * 0.030
    one_block = AUDIT_ROUNDS * tokens * 0.060
    assert seconds - best <= EXPLORE_SHARE * seconds + one_block
    assert book.audit_regret <= EXPLORE_SHARE * book.decode_seconds + one_block
    assert played.count("chain@3") > 0  # it was checked


def play(book: ArmBook, arms: dict[str, TrueArm], prices: dict[str, Price], rounds: int) -> list[tuple[str, bool]]:
    """Run the policy against the true arms: (arm, audited) per round."""
    played = []
    for _ in range(rounds):
        arm, audit = book.next_arm(prices)
        truth = arms[arm]
        book.observe(arm, truth.tokens, truth.spt * truth.tokens, prices[arm].spt, audit, book.incumbent_spt)
        played.append((arm, audit))
    return played


def test_a_tree_known_only_by_its_prediction_is_audited_before_it_leads_a_measured_sibling():
    """best-first@8 measured (100 tokens); best-first@4 predicted 25% faster than @8 measures but
    truly slower (the rank model overpredicted the smaller tree more than the family's κ corrects):
    @8 stays the incumbent from the first round, and @4 runs only as audits. Across families the
    prediction still leads at once: a tree predicted faster than a measured target alone runs first."""
    arms = {"best-first@8": TrueArm(0.15, 4), "best-first@4": TrueArm(0.19, 3), "target": TrueArm(0.40, 1)}
    prices = {"best-first@8": Price(0.15, 0.60), "best-first@4": Price(0.12, 0.36)}
    book = ArmBook(arms={"best-first@8": Tally(tokens=100, seconds=16.0, rounds=25)})
    played = play(book, arms, prices, 100)
    assert played[0] == ("best-first@8", False)
    assert all(audit for arm, audit in played if arm == "best-first@4")
    assert book.audit_regret <= EXPLORE_SHARE * book.decode_seconds + AUDIT_ROUNDS * 3 * 0.19  # within their share, plus one block

    across = ArmBook(arms={"target": Tally(tokens=100, seconds=40.0, rounds=100)})
    assert play(across, arms, {"target": Price(0.40, 0.40), "best-first@4": Price(0.12, 0.36)}, 1) == [("best-first@4", False)]


@pytest.mark.parametrize("longest_known", [True, False])
def test_an_unmeasured_tree_is_audited_at_the_longest_its_round_can_take(longest_known):
    """A big best-first tree priced at ~10 levels drafts a chain of all its nodes on text the drafter
    is sure of: its rounds take twice their prediction. Budgeted at its longest round
    (cost_model.longest_round), its first audit keeps the audits' regret within EXPLORE_SHARE of the
    decode time; budgeted at its prediction, it does not."""
    incumbent, big = TrueArm(0.20, 5), TrueArm(2.10 / 8, 8)  # 1.0 s rounds; the big tree's 2.10 s rounds
    prices = {"best-first@8": Price(0.20, 1.0), "best-first@31": Price(0.22, 5 * 0.22, longest_round=2.10 if longest_known else None)}
    book = ArmBook(arms={"best-first@8": Tally(tokens=40, seconds=8.0, rounds=8)})
    audited = 0
    while audited < AUDIT_ROUNDS:
        arm, audit = book.next_arm(prices)
        truth = incumbent if arm == "best-first@8" else big
        book.observe(arm, truth.tokens, truth.spt * truth.tokens, prices[arm].spt, audit, book.ranked(prices)[0][1])
        audited += audit
    assert audit and arm == "best-first@31"
    assert (book.audit_regret <= EXPLORE_SHARE * book.decode_seconds) == longest_known


def test_the_book_persists_at_half_weight(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    book, _, _, _ = simulate({"target": TrueArm(0.03, 1)}, {"target": 0.05}, 50)
    save_book(book, "toy", "cpu")
    again = load_book("toy", "cpu")
    assert again.arms["target"].tokens == pytest.approx(book.arms["target"].tokens / 2)
    assert again.spt("target", 0.05) == pytest.approx(book.spt("target", 0.05), rel=0.1)  # the same belief, held less firmly
    (tmp_path / "arms" / "toy-cpu.json").write_text("[1, 2, 3]")  # a file of the wrong shape is a fresh book
    assert load_book("toy", "cpu").arms == {}


# --- the whole planner, a poisoned profile, simulated rounds ----------------------------------------
QUIET_TARGET = LatencyCurve((1, 2, 3, 4, 5, 8, 9, 16, 17, 32), (0.03, 0.061, 0.086, 0.116, 0.125, 0.233, 0.242, 0.269, 0.333, 0.456))
DRAFTER = LatencyCurve((1, 2, 4, 8, 16, 32), (0.020, 0.038, 0.050, 0.082, 0.121, 0.207))
# one busy minute: every 1-4 token pass read 0.17 s (padded)
POISONED = LatencyCurve(QUIET_TARGET.ns, tuple(max(t, 0.17) for t in QUIET_TARGET.seconds))


def make_planner(tmp_path, monkeypatch, target_curve: LatencyCurve):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    profile = SimpleNamespace(curves=Curves(target_curve, DRAFTER), overlap_possible=False, busy=False, target_context=64)
    monkeypatch.setattr(autoplan, "saved_profile", lambda backends: profile)
    backends = SimpleNamespace(pair="toy", memory=None, max_tree=32, make_decode_batch=lambda: None, model_files=None)
    return autoplan.AutoPlanner(backends)


def play_round(planner, spec: DraftSpec | None, context: int, rng) -> int:
    """One round as the real pair runs on an AVX-512 EPYC in RAM: the target's quiet curve, the
    drafter's calls per level, each drafted token accepted with p = 0.8. Returns tokens emitted."""
    budget = spec.budget if spec is not None else 0
    if spec is not None and spec.builder in (*FREE, TARGET_FREE):
        budget = 0  # prose: no earlier occurrence to copy, nothing recycled
    tree = DraftTree.chain(7, list(range(100, 100 + budget)))
    accepted = 0
    while accepted < budget and rng.random() < 0.8:
        accepted += 1
    draft = sum(DRAFTER(1) for _ in range(budget))
    seconds = draft + QUIET_TARGET(budget + 1) + 0.002
    path = list(range(accepted + 1))
    planner.observe(RoundReport(tree, path, spec, QUIET_TARGET(budget + 1), seconds, context))
    return len(path)


def test_a_poisoned_profile_is_corrected_within_one_answer(tmp_path, monkeypatch):
    planner = make_planner(tmp_path, monkeypatch, POISONED)
    rng = np.random.default_rng(0)
    spec = planner.spec(Sampling(), context=40)
    assert spec is not None and spec.builder in ("chain", "best-first")  # the poisoned profile says: draft
    context, played = 40, []
    while context < 40 + 150:
        played.append(planner.playing)
        context += play_round(planner, spec, context, rng)
        spec = planner.replan()
    assert planner.plan.builder in ("target-only", *FREE)  # on prose free drafters find nothing: a round of one is the target alone
    undrafted = ["target" if arm in ("target", *FREE) else arm for arm in played]
    assert first_settled(undrafted, "target") <= SETTLE_ROUNDS
    later = undrafted[first_settled(undrafted, "target") :]
    assert later.count("target") >= 0.9 * len(later)


def test_a_right_profile_keeps_the_target_alone_from_the_first_round(tmp_path, monkeypatch):
    planner = make_planner(tmp_path, monkeypatch, QUIET_TARGET)
    assert arm_of(planner.spec(Sampling(), context=40)) == "target"  # (its rounds sized suffix drafts: none on prose)
    rng = np.random.default_rng(1)
    context, played = 40, []
    spec = None
    while context < 40 + 300:
        played.append(planner.playing)
        context += play_round(planner, spec, context, rng)
        spec = planner.replan()
    assert sum(arm in ("target", *FREE) for arm in played) >= 0.95 * len(played)
    summary = planner.summary()
    assert summary["arm"]["name"] in ("target", *FREE) and summary["arm"]["measured_tokens_per_second"] == pytest.approx(1 / 0.032, rel=0.1)


def test_a_trees_first_round_of_an_answer_is_booked_to_the_trees_together(tmp_path, monkeypatch):
    """An answer's first round of a tree carries the drafter's catch-up on the prompt (and its
    hardest first token): 1 token in 1.5 s. Booked to the tree that happened to run it, it would
    put that tree at several times its true seconds per token; it goes to the trees' family (κ,
    every tree alike) and the tree's own record starts with its next round."""
    planner = make_planner(tmp_path, monkeypatch, POISONED)
    spec = planner.spec(Sampling(), context=40)
    arm = arm_of(spec)
    assert family_of(arm) == "model"
    planner.observe(RoundReport(DraftTree.chain(7, list(range(100, 100 + spec.budget))), [0], spec, 0.2, 1.5, 40))
    assert planner.book.arms.get(arm, Tally()).tokens == 0
    assert planner.book.families["model"].tokens == 1 and planner.book.families["model"].seconds == 1.5
    planner.observe(RoundReport(DraftTree.chain(7, list(range(100, 100 + spec.budget))), [0, 1, 2], spec, 0.2, 0.3, 41))
    assert planner.book.arms[arm].tokens == pytest.approx(3.0, rel=0.01)  # its next round is the tree's own
