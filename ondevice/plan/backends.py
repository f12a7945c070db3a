"""Which backends run the target and the drafter (`--target-backend auto`, `--drafter-backend auto`):
chosen as the tree is, by predicted speed on this machine's measured curves.

For every pair of backends the profile has measured (a target pass curve × a drafter call curve),
the cost model's best plan — a draft tree, or the target alone where drafting does not pay —
predicts tokens per second; the fastest pair wins if it beats the default pair (llama.cpp for
both on a CPU) by MARGIN, the noise of a profile on a shared machine (docs/measurements/code-notes.md,
"Profile noise"). Only measured backends compete: nothing is chosen
on faith, so where ONNX Runtime measured slower than llama.cpp it is not picked there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ondevice.plan.cost_model import Plan, choose_plan
from ondevice.plan.profile import Profile

DEFAULT = ("llama", "llama")  # the pair a CPU runs unless another measured clearly faster
MARGIN = 1.1


@dataclass(frozen=True)
class BackendOption:
    target: str
    drafter: str
    plan: Plan  # the best plan with these two (target alone if drafting does not pay)

    @property
    def tokens_per_second(self) -> float:
        return self.plan.predicted_tokens_per_second


def backend_options(profile: Profile, p_rank, target: str | None = None, drafter: str | None = None) -> list[BackendOption]:
    """Every measured (target, drafter) pair, fastest first; `target`/`drafter` fix one side."""
    p_rank = np.asarray(p_rank, dtype=np.float64)
    options = []
    for t in profile.targets if target is None else [target]:
        for d in profile.drafters if drafter is None else [drafter]:
            if t in profile.targets and d in profile.drafters:
                options.append(BackendOption(t, d, choose_plan(profile.curves_for(t, d), p_rank, profile.overlap_possible)))
    return sorted(options, key=lambda o: -o.tokens_per_second)


def best_backends(profile: Profile | None, p_rank, target: str | None = None, drafter: str | None = None) -> BackendOption | None:
    """The fastest measured pair, unless the default pair is within MARGIN of it (None: the profile
    has none to offer)."""
    options = backend_options(profile, p_rank, target, drafter) if profile is not None else []
    default = next((o for o in options if (o.target, o.drafter) == (target or DEFAULT[0], drafter or DEFAULT[1])), None)
    if options and default is not None and options[0].tokens_per_second < MARGIN * default.tokens_per_second:
        return default
    return options[0] if options else None
