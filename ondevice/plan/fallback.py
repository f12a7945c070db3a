"""When drafting with the model does not pay: decode with prompt lookup, or with the target alone.

Prompt lookup (draft/lookup.py) costs no drafting time, but its tree still makes the target's pass
bigger: a round with a match verifies k + 1 tokens, a round without one verifies the root alone.
With a = P(the target accepts a drafted level | it accepted the levels above it), geometric as for
a chain, a round with a match emits E_k = 1 + a + … + a^k tokens. How many rounds match depends on
k (a matched round covers up to k + 1 tokens of a copied run), so what is learned is s, the share
of emitted tokens that come from rounds with a match, and the match rate at budget k follows:

    m_k = s / (s + E_k·(1 − s))                      (so that m_k·E_k / (m_k·E_k + 1 − m_k) = s)
    E[tokens per pass] = m_k·E_k + (1 − m_k)
    seconds per pass   = m_k·t_target(k + 1) + (1 − m_k)·t_target(1) + overhead

Lookup is used at the budget k with the fewest seconds per token if that beats the target alone,
(t_target(1) + overhead) per token. s and a are learned online (`LookupTracker`): from rounds
decoded with lookup (`AutoPlanner.observe`, which sees the trees of the answers it planned), and,
for answers the target decoded alone, by replaying lookup over the answer (what it would have proposed at each round, and how much of that
the target went on to emit). The replay is free, and without it a conservative prior, which keeps
fresh prompts on the target alone, could never be proven wrong.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.plan.curve import Curves
from ondevice.plan.acceptance import acceptance_file
from ondevice.plan.cost_model import Plan
from ondevice.paths import read_state, write_json
from ondevice.decode.protocols import Drafter, DraftSpec
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import child_index

# Prior: little of the text matches and few drafted tokens are accepted, so on a steep CPU target
# curve (t(2) ≈ 1.5·t(1)) lookup must first prove itself; on a flat (offloaded) curve it still wins,
# since there a bigger pass costs nothing.
SHARE_PRIOR = 0.3
ACCEPT_PRIOR = 0.3
PRIOR_WEIGHT = 30.0  # tokens' (share) and drafted levels' (acceptance) worth of observations
DECAY = 0.995  # per observed round: forget old answers (a chat moves from code edits to prose)
MAX_LOOKUP_BUDGET = 16  # beyond, E grows by at most a^17 / (1 − a): 0.11 tokens at a = 0.8
REPLAY_BUDGET = 16


class LookupTracker:
    """Online s (share of tokens from matched rounds) and a (per-level acceptance given a match),
    each a Beta posterior with `prior_weight` pseudo-observations; counts fade by `decay` per round."""

    def __init__(self, share_prior: float = SHARE_PRIOR, accept_prior: float = ACCEPT_PRIOR,
                 prior_weight: float = PRIOR_WEIGHT, decay: float = DECAY):
        self.share_prior, self.accept_prior = share_prior, accept_prior
        self.prior_weight, self.decay = prior_weight, decay
        self.tokens = self.matched_tokens = 0.0  # tokens emitted, of them by rounds that drafted
        self.at_risk = self.accepted = 0.0  # drafted levels the target judged, levels it accepted

    @property
    def share(self) -> float:
        return (self.matched_tokens + self.prior_weight * self.share_prior) / (self.tokens + self.prior_weight)

    @property
    def acceptance(self) -> float:
        return (self.accepted + self.prior_weight * self.accept_prior) / (self.at_risk + self.prior_weight)

    def observe_round(self, matched: bool, at_risk: int, accepted: int) -> None:
        """One round: whether lookup drafted, its levels at risk and accepted (emitted: accepted + 1)."""
        for name in ("tokens", "matched_tokens", "at_risk", "accepted"):
            setattr(self, name, getattr(self, name) * self.decay)
        self.tokens += accepted + 1
        self.matched_tokens += (accepted + 1) if matched else 0
        self.at_risk += at_risk
        self.accepted += accepted

    def observe(self, tree: DraftTree, path: Sequence[int]) -> None:
        """One lookup round: a level was at risk at every node of the accepted path that had children."""
        if len(tree) == 1:
            self.observe_round(False, 0, 0)
            return
        has_child = np.zeros(len(tree), dtype=bool)
        has_child[tree.parents[1:]] = True
        self.observe_round(True, int(has_child[list(path)].sum()), len(path) - 1)

    def matched_tokens_per_pass(self, budget: int) -> float:
        """E_k: tokens a round with a match emits."""
        return float(np.sum(self.acceptance ** np.arange(budget + 1)))

    def match_rate(self, budget: int) -> float:
        """m_k: the share of rounds at this budget that find a match."""
        s, e = self.share, self.matched_tokens_per_pass(budget)
        return s / (s + e * (1.0 - s))

    def tokens_per_pass(self, budget: int) -> float:
        m = self.match_rate(budget)
        return m * self.matched_tokens_per_pass(budget) + 1.0 - m

    # --- persistence, one file per model pair (next to AcceptanceTracker's) -----------------------
    FIELDS = ("share_prior", "accept_prior", "prior_weight", "decay", "tokens", "matched_tokens", "at_risk", "accepted")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    def save(self, pair: str, builder: str = "lookup") -> Path:
        return write_json(acceptance_file(f"{pair}-{builder}.json"), self.to_dict())

    @classmethod
    def load(cls, pair: str, builder: str = "lookup") -> "LookupTracker":
        """The saved tracker for this pair and free builder (lookup, suffix, recycle: each learns the
        same two numbers of its own rounds), or a fresh one with the prior."""
        def parse(d: dict) -> "LookupTracker":
            share, accept, weight, decay, *counts = (float(d[k]) for k in cls.FIELDS)
            if not (0 <= share <= 1 and 0 <= accept <= 1 and 0 < weight < math.inf and 0 < decay <= 1 and all(0 <= c < math.inf for c in counts)):
                raise ValueError("priors in 0..1, prior_weight > 0, 0 < decay <= 1 and counts >= 0 expected")
            tracker = cls(share, accept, weight, decay)
            tracker.tokens, tracker.matched_tokens, tracker.at_risk, tracker.accepted = counts
            return tracker

        return read_state(acceptance_file(f"{pair}-{builder}.json"), parse, f"{builder} record") or cls()


def lookup_plan(curves: Curves, tracker: LookupTracker, overhead_per_pass: float = 0.0, max_budget: int = MAX_LOOKUP_BUDGET,
                builder: str = "lookup") -> Plan | None:
    """The fastest predicted budget of a free drafter (lookup, suffix, recycle) whose rounds the
    tracker learned (None: the target curve is too short for any tree)."""
    t1 = curves.target(1)
    best = None
    for k in range(1, min(max_budget, curves.target.max_n - 1) + 1):
        m = tracker.match_rate(k)
        seconds = m * curves.target(k + 1) + (1 - m) * t1 + overhead_per_pass
        tps = tracker.tokens_per_pass(k) / seconds
        if best is None or tps > best.predicted_tokens_per_second:
            best = Plan(builder, k, k, tracker.tokens_per_pass(k), tps, 1.0 / (t1 + overhead_per_pass), False)
    return best


def fallback_plan(plan: Plan, curves: Curves, tracker: LookupTracker, overhead_per_pass: float = 0.0) -> Plan:
    """`plan` is choose_plan's target-only fallback: prompt lookup instead if it is predicted to be
    faster than the target alone; the fallback reason says which one decodes and why."""
    lookup = lookup_plan(curves, tracker, overhead_per_pass)
    learned = f"{tracker.share:.0%} of tokens in matched rounds, {tracker.acceptance:.0%} of drafted tokens accepted"
    if lookup is not None and lookup.predicted_speedup > 1.0:
        reason = f"{plan.fallback_reason}; using prompt lookup @{lookup.budget} ({learned}: {lookup.predicted_speedup:.2f}× predicted)"
        return replace(lookup, fallback_reason=reason)
    why = f" (prompt lookup: {learned}, {lookup.predicted_speedup:.2f}× at best)" if lookup is not None else ""
    return replace(plan, fallback_reason=f"{plan.fallback_reason}; using the target alone{why}")


def follow(tree: DraftTree, continuation: Sequence[int]) -> list[int]:
    """The root-first path greedy verification would accept if the target emits `continuation`."""
    child = child_index(tree)
    path = [0]
    for token in continuation:
        nxt = child.get((path[-1], int(token)))
        if nxt is None:
            break
        path.append(nxt)
    return path


def replay(tracker: LookupTracker, tokens: Sequence[int], start: int, budget: int = REPLAY_BUDGET,
           drafter: Drafter | None = None) -> None:
    """Learn from an answer decoded without lookup: tokens = prompt + answer, the answer from `start`.
    Rounds go where lookup's would have (a round emits its accepted drafts + one target token);
    rounds whose `budget` next tokens are not all known are left out (they would look rejected)."""
    drafter = drafter or PromptLookupDrafter(n_vocab=0)  # q is never needed: trees are only walked
    ids = np.asarray(tokens, dtype=np.int64)
    spec = DraftSpec("lookup", budget)  # free drafters ignore the builder name
    t = start
    while t + budget < len(ids):
        tree = drafter.draft(ids[:t], spec)
        path = follow(tree, ids[t : t + budget])
        tracker.observe(tree, path)
        t += len(path)
