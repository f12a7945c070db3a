"""The closed loop: what each configuration measured on this machine, and which one runs next.

An *arm* is a way to decode a round: "target" (the target alone), a free drafter — "lookup",
"suffix", "recycle", at the budget its tracker prefers — or a tree from the drafter model,
"chain@B" / "best-first@B" / "hybrid@B" (best-first seeded with the free drafters' proposals). Every
round (drafting, one target pass, verification, and what the caller did with the last step) is
timed on the wall clock and booked to the arm that ran it: tokens emitted, seconds.

**Estimate.** An arm's seconds per token (spt, lower is better):

    spt(a) = (S_a + W·κ_f·p_a) / (N_a + W)        κ_f = (S_f + W·p̄_f) / (P_f + W·p̄_f)

S_a, N_a: the seconds and tokens the arm measured; p_a: the cost model's prediction now (profile
curves rescaled by the passes seen, acceptance learned so far), worth W = PRIOR_TOKENS tokens;
κ_f: what the arm's family (the target alone, each free drafter, the model's trees) measured
against what was predicted for the same rounds (S_f against P_f = Σ tokens·p, p predicted with
the target pass each round actually took — `Price.after_pass`: pass times are the curve's to
learn), so one tree found slower than predicted makes every unmeasured tree look slower too. An
arm nobody can price (no profile yet) is known only once measured. Measured seconds are what the
arm costs now: all sums fade by DECAY per emitted token (acceptance follows the text, the
machine's load changes), and a saved book is loaded at half weight, its target passes rescaled to
the machine's speed now where the load timed it (`ArmBook.rescale`). (Measuring arms as ratios to their
predictions instead double-counts whatever the predictions learn from the same rounds — the
pass times, the free drafters' acceptance: docs/measurements/code-notes.md, "Arms as ratios".)

**Policy: exploit, with a bounded audit.** Each round runs the *incumbent*, the arm with the lowest
spt among those that may lead: an arm measured for LEAD_TOKENS tokens or more, or one whose family
has no such arm among the candidates (`may_lead`). So a tree known mostly by its prediction is
audited before it takes the lead from a measured tree: the rank model's error differs from budget
to budget, more than the family's κ takes up (docs/measurements/2026-12-06-drafting-and-the-lead.md). Across
families a prediction still leads at once (a tree predicted faster than a measured target alone
runs). A *runner-up* is audited for AUDIT_ROUNDS rounds when
  (1) it could be better: its optimistic spt, spt(a) / o_a with o_a = 1 + (OPTIMISM − 1)·W/(N_a + W),
      beats the incumbent's — the cost model is trusted to within a factor OPTIMISM = 2, and less
      slack is left the more the arm has been measured; and
  (2) the audits' *regret* — seconds they took beyond what the incumbent would have needed for the
      same tokens, switch costs included (a drafter catching up on the tokens it did not see) —
      stays within EXPLORE_SHARE of the decode time, counting the block about to run (estimated
      at the runner-up's optimistic spt, and at least MIN_AUDIT_REGRET of its time; an arm never
      measured, at the longest its rounds can take where that is known: a tree that may draft a
      chain of all its nodes, `Price.longest_round`).
A round of the target alone costs one cheap pass, so while a tree is the incumbent the target is
audited often; a tree audited while the target leads pays its drafter's catch-up, so it is rare.

**Worst case.** Audits lose at most EXPLORE_SHARE (2%) of the time the incumbent alone would take,
plus one block's misestimate; the rest of the time runs the best arm measured so far. A prediction
off by up to 2x in either direction is corrected: a runner-up predicted 2x too slow still passes
(1) and is measured; an incumbent predicted 2x too fast is measured every round it runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ondevice.paths import read_state, state_file, write_json
from ondevice.decode.protocols import FREE_BUILDERS, TARGET_FREE, DraftSpec

PRIOR_TOKENS = 8.0  # W: a prediction's worth, in measured tokens
OPTIMISM = 2.0  # how far off a prediction may be; an unmeasured arm may be this much faster
SIBLING_OPTIMISM = 1.25  # ... once other arms of its family were measured (κ took up the family's error)
LEAD_TOKENS = 3 * PRIOR_TOKENS  # measured tokens a tree needs to take the lead from a measured sibling (3x its prediction's worth)
EXPLORE_SHARE = 0.02  # audits' regret, as a share of decode time
AUDIT_ROUNDS = 3  # rounds an audit runs a runner-up (its switch round not counted)
MIN_AUDIT_REGRET = 0.25  # a block is budgeted at no less than this share of its time (no audit is free up front)
DECAY = 0.999  # per emitted token: half-life ~700 tokens
LOAD_WEIGHT = 0.5  # a saved book's sums count half in a new session
FAMILIES = ("target", "lookup", "model")


def arm_of(spec: DraftSpec | None) -> str:
    """The arm a round's spec runs: "target" (also with the free drafts that pay for its pass: TARGET_FREE,
    draft/sizing.py), "lookup", or "<builder>@<budget>"."""
    if spec is None or spec.budget <= 0 or spec.builder == TARGET_FREE:
        return "target"
    if spec.builder in FREE_BUILDERS:
        return spec.builder  # at the budget its tracker prefers
    return f"{spec.builder}@{spec.budget}"


def family_of(arm: str) -> str:
    """"model" for the drafter model's trees; every other arm (the target alone, each free drafter) is its own."""
    return "model" if "@" in arm else arm


@dataclass
class Tally:
    """Faded sums of what rounds measured: tokens, seconds, rounds, and the seconds predicted for
    the same tokens (Σ tokens·p at the time of each round; 0 where no prediction existed)."""

    tokens: float = 0.0
    seconds: float = 0.0
    rounds: float = 0.0
    predicted: float = 0.0
    predicted_tokens: float = 0.0  # the tokens `predicted` covers
    predicted_seconds: float = 0.0  # ... and the seconds they measured
    pass_seconds: float = 0.0  # the target passes' share of `seconds` (what a faster or slower disk changes)

    def add(self, tokens: int, seconds: float, spt_predicted: float | None, pass_seconds: float = 0.0) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.pass_seconds += min(pass_seconds, seconds)
        self.rounds += 1
        if spt_predicted is not None:
            self.predicted += tokens * spt_predicted
            self.predicted_tokens += tokens
            self.predicted_seconds += seconds

    @property
    def ratio(self) -> float | None:
        """Measured / predicted over the rounds that had a prediction."""
        return self.predicted_seconds / self.predicted if self.predicted > 1e-12 else None

    def fade(self, factor: float) -> None:
        for f in fields(self):  # every sum
            setattr(self, f.name, getattr(self, f.name) * factor)

    def pass_scaled(self, factor: float) -> None:
        """As if every target pass had taken `factor` times as long (the rest of each round as it was);
        the seconds predicted for these rounds move alike, so measured / predicted (κ) stays."""
        if self.seconds <= 1e-12:
            return
        scale = (self.seconds + self.pass_seconds * (factor - 1.0)) / self.seconds
        self.seconds *= scale
        self.pass_seconds *= factor
        self.predicted *= scale
        self.predicted_seconds *= scale

    @property
    def spt(self) -> float | None:
        return self.seconds / self.tokens if self.tokens > 1e-9 else None

    @property
    def seconds_per_round(self) -> float | None:
        return self.seconds / self.rounds if self.rounds > 1e-9 else None


@dataclass(frozen=True)
class Price:
    """What the cost model predicts for an arm: seconds per token and per round (None: no profile),
    and `floor`, the fewest seconds per token it could physically take given what was measured
    (None: nothing better known than the prediction / OPTIMISM)."""

    spt: float | None
    round_seconds: float | None = None
    floor: float | None = None
    pass_seconds: float | None = None  # the target pass's share of round_seconds
    longest_round: float | None = None  # the longest a round could take (a tree drafting a chain: cost_model.longest_round)

    @property
    def tokens_per_round(self) -> float | None:
        """The tokens a round is predicted to emit (None: no prediction of its round)."""
        return self.round_seconds / self.spt if self.spt and self.round_seconds is not None else None

    def after_pass(self, measured_pass: float) -> float | None:
        """The prediction for a round whose target pass took `measured_pass`: the pass time is the
        curve's to learn (rescale.py); what the arm learns is the rest — drafting, acceptance,
        overhead. Learning the pass time twice (the curve and the arm's ratio) double-counts it."""
        if self.spt is None or self.round_seconds is None or self.pass_seconds is None:
            return self.spt
        return max(self.round_seconds - self.pass_seconds + measured_pass, 1e-9) / self.tokens_per_round


@dataclass
class Audit:
    arm: str
    rounds_left: int
    switch_pending: bool  # its first round will also pay a switch (the drafter catching up)


@dataclass(frozen=True)
class Yardstick:
    """The drafter-less 1-token pass a load timed (loading/drafter_room.AlonePass): its seconds, and the
    layers its plan kept. Two timings of the same plan say how the machine's speed moved between them;
    a timing of another plan (another memory limit, the same book) says how the plan moved."""

    seconds: float
    kept_layers: int

    def comparable(self, other: "Yardstick") -> bool:
        return abs(self.kept_layers - other.kept_layers) <= 1  # a layer either way: one process's RSS to the next

    @classmethod
    def from_dict(cls, d) -> "Yardstick | None":
        try:
            seconds, layers = float(d["seconds"]), int(d["kept_layers"])
        except (TypeError, KeyError, ValueError):
            return None
        return cls(seconds, layers) if math.isfinite(seconds) and seconds > 0 else None


@dataclass
class ArmBook:
    """Measured arms of one regime (machine, pair, backends, in RAM or streamed), and the policy."""

    arms: dict[str, Tally] = field(default_factory=dict)
    families: dict[str, Tally] = field(default_factory=dict)
    decode_seconds: float = 0.0  # this session's rounds
    audit_regret: float = 0.0  # this session's audits: seconds beyond the incumbent's pace
    audit: Audit | None = None
    incumbent_spt: float | None = None  # the incumbent's estimate when the last arm was chosen
    yardstick: Yardstick | None = None  # a streaming regime: the drafter-less pass timed at the load its rounds
    # ran after (the machine's speed then: `rescale`); None: not known
    saved_at: float = 0.0  # when a session last saved it (time.time(); 0: not known)

    def rescale(self, yardstick: Yardstick | None) -> None:
        """Bring what was measured at another time to the machine as `yardstick` times it now: every
        target pass as if it had taken yardstick / self.yardstick times as long (`Tally.pass_scaled`),
        so a rate measured when the disk ran slower or faster is weighed at its speed now
        (docs/measurements/2026-12-06-rates-of-another-day.md). None: nothing timed now, the book stays
        as it is. A book without a yardstick, or with one of another plan (`Yardstick.comparable`), is
        taken as measured now, and labelled."""
        if yardstick is None:
            return
        if self.yardstick is not None and self.yardstick.comparable(yardstick):
            for tally in (*self.arms.values(), *self.families.values()):
                tally.pass_scaled(yardstick.seconds / self.yardstick.seconds)
        self.yardstick = yardstick

    # --- estimates --------------------------------------------------------------------------------
    def kappa(self, family: str) -> float:
        """κ_f: measured / predicted for the family's predicted rounds (1 with no data)."""
        f = self.families.get(family)
        if f is None or f.predicted_tokens <= 1e-9:
            return 1.0
        mean_p = f.predicted / f.predicted_tokens
        return (f.predicted_seconds + PRIOR_TOKENS * mean_p) / (f.predicted + PRIOR_TOKENS * mean_p)

    def spt(self, arm: str, predicted: float | None) -> float | None:
        """Estimated seconds per token (None: neither measured nor predicted): what the arm measured,
        with the family-calibrated prediction as a prior worth PRIOR_TOKENS tokens."""
        t = self.arms.get(arm, Tally())
        if predicted is None:
            return t.spt
        return (t.seconds + PRIOR_TOKENS * self.kappa(family_of(arm)) * predicted) / (t.tokens + PRIOR_TOKENS)

    def optimism(self, arm: str, price: Price) -> float:
        """o_a: how much faster than its estimate the arm could be. 2x for a prediction nothing
        checked, 1.25x where the family's other arms were measured, more where `floor` says so;
        fading to 1 as the arm itself is measured."""
        tokens = self.arms.get(arm, Tally()).tokens
        family = self.families.get(family_of(arm), Tally()).tokens - tokens
        slack = SIBLING_OPTIMISM + (OPTIMISM - SIBLING_OPTIMISM) * PRIOR_TOKENS / (max(family, 0.0) + PRIOR_TOKENS)
        if price.floor and price.spt:
            slack = max(slack, price.spt / price.floor)
        return 1.0 + (slack - 1.0) * PRIOR_TOKENS / (tokens + PRIOR_TOKENS)

    def ranked(self, prices: dict[str, Price]) -> list[tuple[str, float]]:
        """(arm, estimated spt), fastest first, of the candidates that have an estimate."""
        known = [(a, self.spt(a, p.spt)) for a, p in prices.items()]
        return sorted(((a, s) for a, s in known if s is not None), key=lambda x: x[1])

    def may_lead(self, arm: str, candidates) -> bool:
        """Whether `arm` may be the incumbent: it measured LEAD_TOKENS tokens or more (its measurement
        outweighs its prediction three to one), or no candidate of its family did. A tree known mostly
        by its prediction is audited before it takes the lead from a measured sibling: the rank model
        errs by different amounts at different budgets, more than the family's κ takes up."""
        if self.arms.get(arm, Tally()).tokens >= LEAD_TOKENS:
            return True
        family = family_of(arm)
        return not any(self.arms.get(a, Tally()).tokens >= LEAD_TOKENS for a in candidates if a != arm and family_of(a) == family)

    def leading(self, prices: dict[str, Price]) -> list[tuple[str, float]]:
        """`ranked`, the arms that may lead first: the first is the incumbent, the rest challengers."""
        ranked = self.ranked(prices)
        return sorted(ranked, key=lambda x: not self.may_lead(x[0], prices))  # stable: each part stays fastest first

    # --- policy -----------------------------------------------------------------------------------
    def next_arm(self, prices: dict[str, Price], default: str = "target", switch_cost=lambda arm: 0.0) -> tuple[str, bool]:
        """(the arm to run next round, whether it is an audit). prices: the candidates' predictions.
        switch_cost(arm): seconds it costs to start running `arm` now."""
        ranked = self.leading(prices)
        incumbent, spt_incumbent = ranked[0] if ranked else (default, None)
        self.incumbent_spt = spt_incumbent  # what the round about to run is measured against
        if self.audit is not None and self.audit.arm in prices and self.audit.rounds_left > 0:
            return self.audit.arm, True
        self.audit = None
        if spt_incumbent is None:
            return incumbent, False
        challengers = [(s / self.optimism(a, prices[a]), s, a) for a, s in ranked[1:]]
        if not challengers:
            return incumbent, False
        hopeful, spt, arm = min(challengers)
        if hopeful >= spt_incumbent:
            return incumbent, False
        block = AUDIT_ROUNDS * self._audit_round(arm, prices[arm], hopeful / spt, spt_incumbent)
        regret = block * max(MIN_AUDIT_REGRET, 1.0 - spt_incumbent / hopeful) + switch_cost(arm)
        if self.audit_regret + regret > EXPLORE_SHARE * (self.decode_seconds + block):
            return incumbent, False
        self.audit = Audit(arm, AUDIT_ROUNDS, switch_cost(arm) > 0)
        return arm, True

    def _audit_round(self, arm: str, price: Price, speedup: float, spt_incumbent: float) -> float:
        """Seconds an audit round of `arm` is budgeted at: as measured, or predicted, and as fast as
        it could be (`speedup`); an arm never measured at the longest its round could take, where
        that is known (an unmeasured tree's round can run far past its prediction: Price.longest_round)."""
        measured = self.arms.get(arm, Tally()).seconds_per_round
        if measured is None and price.longest_round is not None:
            return max(price.longest_round, (price.round_seconds or 0.0) * speedup)
        return (measured or price.round_seconds or spt_incumbent) * speedup

    def observe(self, arm: str, tokens: int, seconds: float, spt_predicted: float | None, audit: bool,
                spt_incumbent: float | None, switch: bool = False, own: bool = True, pass_seconds: float = 0.0) -> None:
        """One round of `arm`: tokens emitted in `seconds`, `pass_seconds` of them the target's pass.
        spt_predicted: what was predicted for it (None: nothing, or a prediction not to learn from —
        its pass ran far off the curve it was priced on, which the curve itself learns). switch: it paid for a switch of arms (a drafter
        catching up), which is booked to the audits and not to the arm. spt_incumbent: the
        incumbent's estimate when the round ran (an audit's regret is measured against it).
        own=False: a round any arm of the family would have paid for alike (a tree's first round of
        an answer: the drafter catches up on the prompt, and the answer's first token is the
        hardest to draft), booked to the family (κ) and not to the arm, which one slow round could
        otherwise rank below the trees it beats (docs/measurements/2026-12-05-sizing-record.md)."""
        self.fade(DECAY**tokens)
        self.decode_seconds += seconds
        if audit and spt_incumbent is not None:
            self.audit_regret += max(0.0, seconds - tokens * spt_incumbent)
        elif switch and spt_incumbent is not None:  # a switch back to the incumbent: the audit's doing
            self.audit_regret += max(0.0, seconds - tokens * spt_incumbent)
        if audit and self.audit is not None and self.audit.arm == arm:
            self.audit.rounds_left -= 0 if switch else 1
        if switch:
            return
        if own:
            self.arms.setdefault(arm, Tally()).add(tokens, seconds, spt_predicted, pass_seconds)
        self.families.setdefault(family_of(arm), Tally()).add(tokens, seconds, spt_predicted, pass_seconds)

    def fade(self, factor: float) -> None:
        """Weigh everything measured so far by `factor` (the machine changed under it)."""
        for tally in (*self.arms.values(), *self.families.values()):
            tally.fade(factor)

    # --- persistence --------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"arms": {a: asdict(t) for a, t in self.arms.items()}, "families": {f: asdict(t) for f, t in self.families.items()},
                "yardstick": None if self.yardstick is None else asdict(self.yardstick), "saved_at": self.saved_at}

    @classmethod
    def from_dict(cls, d: dict, weight: float = LOAD_WEIGHT) -> "ArmBook":
        saved_at = d.get("saved_at")
        book = cls(yardstick=Yardstick.from_dict(d.get("yardstick")),
                   saved_at=float(saved_at) if isinstance(saved_at, (int, float)) and math.isfinite(saved_at) else 0.0)
        for key, target in (("arms", book.arms), ("families", book.families)):
            for name, values in d.get(key, {}).items():
                tally = Tally(**{k: float(v) for k, v in values.items() if k in Tally.__dataclass_fields__})
                if "predicted_seconds" not in values and tally.tokens > 0:  # a book saved before it was kept
                    tally.predicted_seconds = tally.seconds * tally.predicted_tokens / tally.tokens
                if all(math.isfinite(getattr(tally, k)) and getattr(tally, k) >= 0 for k in Tally.__dataclass_fields__):
                    tally.fade(weight)
                    target[name] = tally
        return book


def book_path(pair: str, regime: str) -> Path:
    return state_file("arms", f"{pair}-{regime}.json")


def load_book(pair: str, regime: str, yardstick: Yardstick | None = None) -> ArmBook:
    """The saved book (at LOAD_WEIGHT), or a fresh one; a file of the wrong shape is replaced (paths.read_state).
    yardstick: the machine's speed as the load timed it, which the book's seconds are rescaled to (`ArmBook.rescale`)."""
    book = read_state(book_path(pair, regime), ArmBook.from_dict, "planner's measurements") or ArmBook()
    book.rescale(yardstick)
    return book


def save_book(book: ArmBook, pair: str, regime: str) -> Path:
    book.saved_at = time.time()
    return write_json(book_path(pair, regime), book.to_dict())
