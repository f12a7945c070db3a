"""The drafter's time, rescaled online from the rounds actually measured (as rescale.py does the target's).

The cost model prices a tree's drafting from the profile's drafter curve, one call per level of the
tree's shape, each at the batch of that level. A real best-first round costs more, and more so the
bigger the tree: it makes more calls than the shape has levels, each dearer than the profile's
probe (siblings decoded on their own branches). Measured under a 1.2 GB cgroup (default pair,
heldout8, 2 × 48 tokens): predicted 108 / 174 / 285 ms per round at best-first @8 / @15 / @31,
measured 162–227 / 289–358 / 608–633 — and the planner, trusting the forecast, ran @31 where @8 was
7–26% faster. So every round the drafter model drafted (after one it already drafted, so that its
cache had nothing to catch up on) weighs in: the round's time beyond its target pass and the
per-round overhead is its drafting, against what its plan predicted at scale 1:

    scale = (Σ measured + PRIOR) / (Σ predicted + PRIOR)      (sums faded by FADE per round)

clipped to RANGE. The planner prices every tree with the drafter's curve × scale, and prices again
when the scale moved by more than REPRICE since the last pricing. The prior is worth a few rounds,
so one slow round (another process took the CPU) does not reprice everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRIOR = 0.5  # seconds of drafting predicted = measured: ~3 rounds of a best-first @8 tree
FADE = 0.98  # per round the drafter drafted: half-life ~35 rounds
RANGE = (0.5, 4.0)
REPRICE = 0.2  # re-price the trees when the scale moved by more than this since they were priced


@dataclass
class DraftTimes:
    measured: float = 0.0  # seconds, faded
    predicted: float = 0.0  # seconds the plans predicted at scale 1, faded
    priced_at: float = 1.0  # the scale the current plans were priced with

    @property
    def scale(self) -> float:
        return min(max((self.measured + PRIOR) / (self.predicted + PRIOR), RANGE[0]), RANGE[1])

    def observe(self, measured_seconds: float, predicted_seconds: float) -> None:
        """One round: its drafting, measured, and what its plan predicted (priced at `priced_at`)."""
        if predicted_seconds <= 0 or measured_seconds < 0:
            return
        self.measured = FADE * self.measured + measured_seconds
        self.predicted = FADE * self.predicted + predicted_seconds / self.priced_at

    def moved(self) -> bool:
        """Whether the scale moved enough since the last pricing to price the trees again."""
        return abs(math.log(self.scale / self.priced_at)) > math.log1p(REPRICE)
