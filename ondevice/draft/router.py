"""DraftRouter: one Drafter for the engine that sends each round to the drafter of `spec.builder`.

The engine holds one drafter; the pipeline wires the drafter model (llama.cpp or ONNX: chain,
best-first, multi-seq, hybrid) and the free drafters behind this router, so `--tree lookup` and the
planner's fallback to lookup need nothing from the engine. The free drafters live as long as the
pipeline, so they keep what this session taught them:

- suffix:  SuffixDrafter, the session's text in a suffix automaton. The router shows it every
           context, whatever builds the round's tree (a few µs per new token), so its history
           holds every prompt and answer drafted for, not only the rounds it drafted.
- recycle: TokenRecycler, filled by `learn` (the engine's hook after every verification).
- lookup:  PromptLookupDrafter (stateless).
- hybrid:  the three free trees, each re-priced by its source's record (draft/calibrate.py: how
           often its proposals came true, judged against the next round's context) and merged
           (free_tree.merge_trees), handed to the drafter model, which grows its best-first search
           from them under the same budget (draft/hybrid.py). Without a drafter model it is the
           merged free tree alone.

A free round whose spec carries the target's pass times (the planner's) is sized: its tree, re-priced
by its source's record, is cut to the nodes that pay for their pass (draft/sizing.py), so a weak match
costs a pass of the root alone and a long copy a long chain. TARGET_FREE ("free", the planner's
rounds of the target alone) sizes the three free sources' merged tree, as hybrid trees are seeded.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from ondevice.draft.calibrate import SourceRecord
from ondevice.draft.free_tree import for_rule, merge_trees
from ondevice.draft.recycle import TokenRecycler
from ondevice.draft.sizing import SizingRecord, expected_drafts, sized
from ondevice.draft.suffix_drafter import SuffixDrafter
from ondevice.errors import OndeviceError
from ondevice.decode.protocols import BUILDERS, FREE_BUILDERS, MODEL_BUILDERS, TARGET_FREE, Drafter, DraftSpec
from ondevice.decode.tree import DraftTree


class DraftRouter(Drafter):
    def __init__(self, model: Drafter | None, lookup: Drafter, suffix: SuffixDrafter | None = None, recycler: TokenRecycler | None = None):
        self.model = model
        self.lookup = lookup
        self.n_vocab = model.n_vocab if model is not None else lookup.n_vocab
        self.suffix = suffix if suffix is not None else SuffixDrafter(lookup.n_vocab)
        self.recycler = recycler if recycler is not None else TokenRecycler(lookup.n_vocab)
        self.record = SourceRecord()  # how often each free source's proposals came true
        self.sizing = SizingRecord()  # what the sized rounds' verified drafts were expected to accept, and did
        self.last_builder: str | None = None  # of the last tree drafted (the target alone drafts none)

    def draft(self, context: Sequence[int], spec: DraftSpec) -> DraftTree:
        if spec.builder not in BUILDERS and spec.builder != TARGET_FREE:
            raise OndeviceError(f"unknown draft builder {spec.builder!r}; choose one of {', '.join(BUILDERS)}.")
        self.last_builder = spec.builder
        if len(context):
            self.suffix.index.sync(context)  # history, whatever builds this tree
            self.record.observe(context)  # the last hybrid round's proposals, judged by what the target emitted
        if spec.builder == TARGET_FREE:
            return self.sized(self.free_tree(context, spec), spec)
        if spec.builder in FREE_BUILDERS:
            if spec.pass_seconds is not None:  # the planner's free arm: its source's tree, priced and sized
                return self.sized(self.free_tree(context, spec, (spec.builder,)), spec)
            return self.free_source(spec.builder).draft(context, spec)
        if spec.builder == "hybrid":
            free = self.free_tree(context, spec)
            return self.model.draft(context, spec, free) if self.model is not None else for_rule(
                free, spec.sample_children, spec.temperature, self.lookup.n_vocab)
        if self.model is None:
            raise OndeviceError(f"the {spec.builder} tree needs the drafter model, which is not loaded (--no-draft, or left out to keep more of a streaming target's layers in RAM: start with --tree {spec.builder} to load it); use --tree lookup.")
        return self.model.draft(context, spec)

    def free_source(self, builder: str) -> Drafter:
        return {"lookup": self.lookup, "suffix": self.suffix, "recycle": self.recycler}[builder]

    def sized(self, priced: DraftTree, spec: DraftSpec) -> DraftTree:
        """A priced best-first tree cut to what pays for its pass, as the spec's verification rule needs it."""
        tree = priced
        if spec.pass_seconds is not None:
            tree = sized(priced, spec.pass_seconds, self.sizing.scale(spec.builder))
            self.sizing.sized(spec.builder, float(expected_drafts(np.asarray(tree.logprobs[1:], dtype=np.float64))[-1]))
        return for_rule(tree, spec.sample_children, spec.temperature, self.n_vocab)

    def free_tree(self, context: Sequence[int], spec: DraftSpec, sources: Sequence[str] = ("suffix", "recycle", "lookup")) -> DraftTree:
        """The free sources' proposals for this round (merged in this order), each priced by its
        source's record, merged and cut to the spec's budget (best-first); the record judges them
        against what the target emits next."""
        plain = replace(spec, sample_children=False)  # proposals: q is not needed here
        trees = {name: self.free_source(name).draft(context, plain) for name in sources}
        self.record.propose(context, trees)
        return merge_trees([self.record.price(name, tree) for name, tree in trees.items()], spec.budget, spec.max_depth)

    def learn(self, tree: DraftTree, logits: np.ndarray, path: Sequence[int]) -> None:
        """After a verification pass over a drafted tree: the target's candidates at its nodes go to
        token recycling. A pass of the target alone teaches nothing: a top-k over a 152k-logit row
        costs ~0.4 ms, 1% of such a round on a 2-core CPU, paid on every round of every answer."""
        self.sizing.verified(len(path) - 1)
        if len(tree) > 1 or self.last_builder in ("recycle", "hybrid"):  # its own empty trees must teach it
            self.recycler.learn(tree, logits, path)
        self.last_builder = None  # the next round may be the target alone's, which calls no drafter

    def forget(self) -> None:
        """Drop what this session taught the free drafters (e.g. between benchmark configurations)."""
        self.suffix.forget()
        self.recycler.forget()
        self.record.forget()
        self.sizing = SizingRecord()

    def grows(self, spec: DraftSpec) -> bool:
        """Whether the drafter model can grow this round's search while the target verifies it."""
        return spec.builder in MODEL_BUILDERS and self.model is not None and self.model.grows(spec)

    def grow(self, should_stop) -> int:
        return self.model.grow(should_stop)

    @property
    def carried_fraction(self) -> float:
        return self.model.carried_fraction if self.model is not None else 0.0

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
