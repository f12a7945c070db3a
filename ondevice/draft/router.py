"""DraftRouter: one Drafter for the engine that sends each round to the drafter of `spec.builder`.

The engine holds one drafter; the pipeline wires the drafter model (llama.cpp: chain, best-first,
multi-seq) and the free prompt-lookup drafter (lookup) behind this router, so `--tree lookup` and
the planner's fallback to lookup need nothing from the engine.
"""

from __future__ import annotations

from typing import Sequence

from ondevice.errors import OndeviceError
from ondevice.protocols import FREE_BUILDERS, MODEL_BUILDERS, Drafter, DraftSpec
from ondevice.tree import DraftTree


class DraftRouter:
    def __init__(self, model: Drafter | None, lookup: Drafter):
        self.model = model
        self.lookup = lookup
        self.n_vocab = model.n_vocab if model is not None else lookup.n_vocab

    def draft(self, context: Sequence[int], spec: DraftSpec) -> DraftTree:
        if spec.builder in FREE_BUILDERS:
            return self.lookup.draft(context, spec)
        if spec.builder not in MODEL_BUILDERS:
            raise OndeviceError(f"unknown draft builder {spec.builder!r}; choose one of {', '.join(MODEL_BUILDERS + FREE_BUILDERS)}.")
        if self.model is None:
            raise OndeviceError(f"the {spec.builder} tree needs the drafter model, which is not loaded; use --tree lookup.")
        return self.model.draft(context, spec)

    def grows(self, spec: DraftSpec) -> bool:
        """Whether the drafter model can grow this round's search while the target verifies it."""
        return spec.builder in MODEL_BUILDERS and self.model is not None and getattr(self.model, "grows", lambda s: False)(spec)

    def grow(self, should_stop) -> int:
        return self.model.grow(should_stop)

    @property
    def carried_fraction(self) -> float:
        return getattr(self.model, "carried_fraction", 0.0)

    def close(self) -> None:
        if hasattr(self.model, "close"):
            self.model.close()
