"""Acceptance by rank: p[k] = P(the k-th ranked draft child is the one the target accepts).

The planner (cost_model.py, sequoia.py) needs p[k]. It starts from a prior measured on the default
pair and is updated online by what the target actually accepts (`AcceptanceTracker`), one file per
model pair under `<home>/acceptance/`, so plans follow acceptance as it drifts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ondevice.paths import home, read_state, state_file, write_json
from ondevice.plan.sequoia import MAX_RANK
from ondevice.decode.tree import DraftTree

# Prior for p[k], Qwen2.5-Coder 0.5B drafting for 1.5B (Q4_K_M), measured here by teacher forcing on
# target text: the drafter's top-1 is the target's argmax 86% of the time, its top-4 holds it 98%.
TOP1_AGREEMENT = 0.86
TOP4_AGREEMENT = 0.98


def default_p_rank(top1: float = TOP1_AGREEMENT, top4: float = TOP4_AGREEMENT, decay: float = 0.4) -> np.ndarray:
    """A prior consistent with the two measured numbers: ranks 2–4 share top4 − top1, each `decay`×
    the one before (a guess at the shape, not measured); ranks 5–8 continue the same decay."""
    first_runner_up = (top4 - top1) / (1 + decay + decay**2)  # p[1] + p[2] + p[3] = top4 − top1
    return np.array([top1] + [first_runner_up * decay**i for i in range(MAX_RANK - 1)])


def _hazards(p_rank: np.ndarray) -> np.ndarray:
    """h[k] = P(rank k accepted | ranks < k were not) = p[k] / (1 − Σ_{j<k} p[j])."""
    before = np.concatenate([[0.0], np.cumsum(p_rank)[:-1]])
    return np.clip(p_rank / np.maximum(1.0 - before, 1e-12), 0.0, 1.0)


def acceptance_dir() -> Path:
    return home() / "acceptance"


def acceptance_file(name: str) -> Path:
    """A record in acceptance_dir(), its name checked to be one plain file name there (paths.state_file)."""
    return state_file("acceptance", name)


class AcceptanceTracker:
    """Online p[k] from verifications, censoring-aware.

    At an expanded node on the accepted path, rank k was "at risk" if the tree drafted a rank-k child
    and no better-ranked child was accepted. Each rank's hazard gets a Beta prior worth `prior_weight`
    observations from the default p; old counts fade by `decay` per observed node (drift).
        h[k] = (accepted[k] + w·h0[k]) / (at_risk[k] + w);   p[k] = h[k] · Π_{j<k} (1 − h[j])
    """

    def __init__(self, prior=None, prior_weight: float = 50.0, decay: float = 0.998):
        self.prior = np.asarray(default_p_rank() if prior is None else prior, dtype=np.float64)
        self.prior_weight = prior_weight
        self.decay = decay
        self.accepted = np.zeros(len(self.prior))
        self.at_risk = np.zeros(len(self.prior))

    @property
    def p_rank(self) -> np.ndarray:
        h = (self.accepted + self.prior_weight * _hazards(self.prior)) / (self.at_risk + self.prior_weight)
        survive = np.concatenate([[1.0], np.cumprod(1.0 - h)[:-1]])
        return h * survive

    def observe_node(self, n_children: int, accepted_rank: int | None) -> None:
        """One expanded node: it had n_children drafted children; accepted_rank is None if none matched."""
        self.accepted *= self.decay
        self.at_risk *= self.decay
        seen = min(n_children if accepted_rank is None else accepted_rank + 1, len(self.prior))
        self.at_risk[:seen] += 1
        if accepted_rank is not None and accepted_rank < len(self.prior):
            self.accepted[accepted_rank] += 1

    def observe(self, tree: DraftTree, path: Sequence[int]) -> None:
        """Learn from one verification: `path` is the accepted root-first node path."""
        for i, node in enumerate(path):
            children = np.flatnonzero(tree.parents == node)
            if len(children) == 0:
                continue
            by_rank = children[np.argsort(-tree.logprobs[children], kind="stable")]  # rank 0: most likely draft
            rank = int(np.flatnonzero(by_rank == path[i + 1])[0]) if i + 1 < len(path) else None
            self.observe_node(len(children), rank)

    def drift(self, p_planned) -> float:
        """How far the estimate moved from the p a plan was made with: max |Δ cumulative p|."""
        return float(np.abs(np.cumsum(self.p_rank) - np.cumsum(np.asarray(p_planned)[: len(self.prior)])).max())

    # --- persistence, one file per model pair ---------------------------------------------------
    def to_dict(self) -> dict:
        return {"prior": self.prior.tolist(), "prior_weight": self.prior_weight, "decay": self.decay,
                "accepted": self.accepted.tolist(), "at_risk": self.at_risk.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "AcceptanceTracker":
        tracker = cls(d["prior"], d["prior_weight"], d["decay"])
        tracker.accepted, tracker.at_risk = np.array(d["accepted"], dtype=np.float64), np.array(d["at_risk"], dtype=np.float64)
        arrays = (tracker.prior, tracker.accepted, tracker.at_risk)
        if tracker.prior.ndim != 1 or not 1 <= len(tracker.prior) <= MAX_RANK or any(a.shape != tracker.prior.shape for a in arrays):
            raise ValueError(f"prior, accepted and at_risk must be lists of the same length up to {MAX_RANK}")
        if not all(np.isfinite(a).all() and (a >= 0).all() for a in arrays) or not tracker.prior_weight > 0 or not 0 < tracker.decay <= 1:
            raise ValueError("counts must be finite and not negative, prior_weight > 0, 0 < decay <= 1")
        return tracker

    def save(self, pair: str) -> Path:
        return write_json(acceptance_file(f"{pair}.json"), self.to_dict())

    @classmethod
    def load(cls, pair: str) -> "AcceptanceTracker":
        """The saved tracker for this pair, or a fresh one with the default prior."""
        return read_state(acceptance_file(f"{pair}.json"), cls.from_dict, "acceptance record") or cls()


# Which prior a pair starts from, by family. Only Qwen2.5's was measured (the numbers above); the
# other families take the same numbers as an explicit assumption until their pairs are verified.
MEASURED_PRIOR = {"qwen2.5": "Qwen2.5-Coder 0.5B→1.5B, measured here by teacher forcing"}


def acceptance_for(pair: str, family: str) -> tuple[np.ndarray, str]:
    """(p[k], where it comes from): "measured" (this pair's verifications on this machine), "prior"
    (its family's measured prior) or "assumed" (another family's prior, until it is measured)."""
    tracker = AcceptanceTracker.load(pair)
    if tracker.at_risk[0] >= 1:
        return tracker.p_rank, "measured"
    return tracker.p_rank, "prior" if family in MEASURED_PRIOR else "assumed"
