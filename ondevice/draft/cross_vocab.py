"""A drafter of another tokenizer, lossless: token-level intersection (TLI; Timor et al., ICML 2025).

The drafter model runs as any drafter does (its own KV cache, the same tree builders), on its own
token ids: `TextBridge` gives it the target's context as its own tokens of the same text, and its
logits are restricted to the tokens both vocabularies hold (`VocabMap`: -inf elsewhere, before any
softmax, so every q is a distribution over shared tokens only). Its tree is then written in target
ids, q rows moved to the target's vocabulary, and verified by the same rules as any tree.

Why this stays exact: the target decides every token. Greedy and SpecExec's rule are exact for any
tree of target ids; Sequoia's rule needs each node's children to be draws without replacement from
the q it is given, and they are: draws from the restricted drafter distribution, which the
one-to-one map carries to target ids unchanged.

Hybrid rounds: the model's best-first tree (in target ids) merged with the free sources' proposals
under one budget (draft/free_tree.py); with Sequoia's sampled children, the model's tree alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ondevice.draft.free_tree import merge_trees
from ondevice.draft.model_drafter import BlockedTokens
from ondevice.draft.text_bridge import TextBridge
from ondevice.draft.text_match import TextMatch
from ondevice.errors import OndeviceError
from ondevice.machine.ram import trim_heap
from ondevice.draft.vocab_map import VocabMap
from ondevice.prompt.tokenizer import Tokenizer, vocab_mismatch
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree


MODES = ("tli", "slem")


class CrossVocabDrafter:
    """The Drafter protocol in target ids over a drafter model (`ModelDrafter`) of another vocabulary.

    mode "tli": drafts restricted to the shared tokens, mapped id for id; "slem": drafts over the
    drafter's whole vocabulary, each path's text tokenized by the target (draft/text_match.py) —
    except where Sequoia's rule samples children, which needs TLI's q."""

    def __init__(self, model, vocab_map: VocabMap, bridge: TextBridge, mode: str = "slem"):
        if mode not in MODES:
            raise OndeviceError(f"unknown cross-vocabulary drafting {mode!r}; choose one of {', '.join(MODES)}.")
        self.model, self.map, self.bridge, self.mode = model, vocab_map, bridge, mode
        self.n_vocab = vocab_map.n_target
        self.to_target = vocab_map.to_target
        self.carried_fraction = 0.0
        self.shared = BlockedTokens(model.cache, vocab_map.blocked)
        self.text = TextMatch(bridge.target_tok, bridge.drafter_tok)

    @property
    def max_tree(self) -> int:
        return self.model.max_tree

    def draft(self, context: Sequence[int], spec: DraftSpec, free: DraftTree | None = None) -> DraftTree:
        self.carried_fraction = 0.0
        hybrid = spec.builder == "hybrid"
        ids = self.bridge.convert(context)
        if ids is None or len(ids) > self.model.n_ctx:  # the text ends inside a character, or is longer than the drafter holds
            return free if hybrid and free is not None else DraftTree.root_only(int(context[-1]))
        tli = self.mode == "tli" or (spec.sample_children and spec.temperature > 0)
        self.model.expander = self.shared if tli else self.model.cache
        tree = self.model.draft(ids, replace(spec, builder="best-first") if hybrid else spec)
        self.carried_fraction = self.model.carried_fraction
        if tli:
            mapped = self.map.tree_to_target(tree, int(context[-1]), self.to_target)
        else:
            mapped = self.text.tree(tree, int(context[-1]), spec.budget, spec.max_depth)
        if hybrid and free is not None and len(free) > 1 and not (spec.sample_children and spec.temperature > 0):
            return merge_trees([mapped, free], spec.budget, spec.max_depth)
        return mapped

    def grows(self, spec: DraftSpec) -> bool:
        return self.model.grows(spec)

    def grow(self, should_stop: Callable[[], bool]) -> int:
        return self.model.grow(should_stop)

    def probe_batch(self, n: int) -> None:
        self.model.probe_batch(n)

    def close(self) -> None:
        self.model.close()
        self.bridge.drafter_tok.close()


@dataclass(frozen=True)
class OtherTokenizer:
    """A drafter file's own tokenizer where it is not the target's, and why (tokenizer.vocab_mismatch)."""

    tokenizer: Tokenizer
    reason: str


def other_tokenizer(drafter: Path | None, target_tok: Tokenizer) -> OtherTokenizer | None:
    """The drafter file's own tokenizer where it is not the target's: the cross-vocabulary drafter
    encodes text with it while it drafts; None where the two share one (or there is no drafter)."""
    if drafter is None:
        return None
    drafter_tok = Tokenizer(drafter)
    reason = vocab_mismatch(target_tok, drafter_tok)
    if reason is None:
        drafter_tok.close()
        trim_heap()  # its freed copy handed back to the OS: the memory plan measures the process next
        return None
    return OtherTokenizer(drafter_tok, reason)


def open_drafter(plan, target_tok: Tokenizer, other: OtherTokenizer | None, status: Callable[[str], None] | None = None):
    """The planned drafter model (loading.LoadPlan.open_drafter): as it is where it shares the target's
    tokenizer (other None: `other_tokenizer`), else drafting across vocabularies."""
    if other is None:
        return plan.open_drafter(target_vocab=target_tok.n_vocab)
    drafter_tok = other.tokenizer
    vocab_map = VocabMap.load(target_tok, drafter_tok, status)
    print(f"ondevice: the drafter {drafter_tok.path.name} has another tokenizer ({drafter_tok.n_vocab:,} vs {target_tok.n_vocab:,} ids; "
          f"{other.reason}): it drafts the {len(vocab_map.drafter_ids):,} tokens both hold", file=sys.stderr)
    model = replace(plan, options=replace(plan.options, vocab_trim=False)).open_drafter()  # a trimmed head speaks the catalog target's ids
    return CrossVocabDrafter(model, vocab_map, TextBridge(target_tok, drafter_tok))
