"""SourceRecord: free sources priced by how often their proposals came true.

References: a brute-force judge that compares every proposed node's whole token path with what was
emitted; the empirical frequency of a source's right guesses, drawn at a known rate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ondevice.draft.calibrate import SourceRecord
from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.draft.router import DraftRouter
from ondevice.decode.protocols import DraftSpec, Drafter
from ondevice.decode.tree import DraftTree


def random_tree(rng, vocab: int, n: int) -> DraftTree:
    tokens, parents, logprobs = [int(rng.integers(vocab))], [-1], [0.0]
    for i in range(1, n):
        parent = int(rng.integers(i))
        tokens.append(int(rng.integers(vocab)))
        parents.append(parent)
        logprobs.append(logprobs[parent] + math.log(rng.uniform(0.01, 1.0)))
    return DraftTree(np.array(tokens), np.array(parents), np.array(logprobs))


def brute_counts(tree: DraftTree, emitted: list[int], record: SourceRecord) -> np.ndarray:
    """[judged, right] per bin: a node is judged when the path to its parent spells the emitted
    tokens and the target emitted a token at its depth; right when that token is its own."""
    counts = np.zeros((record.bins, 2))
    for i in range(1, len(tree)):
        path = [int(tree.tokens[n]) for n in tree.path_to(i)[1:]]
        if len(path) <= len(emitted) and path[:-1] == emitted[: len(path) - 1]:
            step = float(tree.logprobs[i] - tree.logprobs[int(tree.parents[i])])
            counts[record.bin(step)] += (1, path[-1] == emitted[len(path) - 1])
    return counts


@pytest.mark.parametrize("seed", range(20))
def test_a_node_is_judged_only_when_its_parent_came_true(seed):
    rng = np.random.default_rng(seed)
    vocab = 3  # small: many paths come true
    record, context = SourceRecord(), [int(t) for t in rng.integers(vocab, size=5)]
    want = np.zeros((record.bins, 2))
    for _ in range(5):
        tree = random_tree(rng, vocab, int(rng.integers(1, 30)))
        emitted = [int(t) for t in rng.integers(vocab, size=int(rng.integers(1, 5)))]
        record.propose(context, {"s": tree})
        context = context + emitted
        record.observe(context)
        want += brute_counts(tree, emitted, record)
    assert np.array_equal(record.counts.get("s", np.zeros_like(want)), want)


def test_proposals_for_another_context_are_not_judged():
    record = SourceRecord()
    record.propose([1, 2, 3], {"s": DraftTree.chain(3, [4, 5])})
    record.observe([9, 2, 3, 4, 5])  # another conversation of the same length and more
    record.observe([1, 2, 3, 4, 5])  # the pending proposals were dropped with it
    assert record.counts == {}


@pytest.mark.parametrize("truth", [0.1, 0.5, 0.9])
def test_a_source_is_priced_by_its_record_not_its_guess(truth):
    """A source that always states 0.95 for its one-token guess, right at rate `truth`: after 400
    rounds its price is the frequency of its right guesses; a confidence it never stated is scaled
    by the same record (0.5 stated: 0.5 × right / stated); another source keeps its own guess."""
    rng = np.random.default_rng(0)
    record, context, right = SourceRecord(), [7], 0
    for _ in range(400):
        record.propose(context, {"liar": DraftTree.chain(context[-1], [1], [math.log(0.95)])})
        token = 1 if rng.random() < truth else 2
        right += token == 1
        context = context + [token]
        record.observe(context)
    assert abs(record.rate("liar", math.log(0.95)) - right / 400) < 0.02
    assert abs(record.rate("liar", math.log(0.55)) - 0.55 * right / (400 * 0.95)) < 0.02
    assert record.rate("other", math.log(0.95)) == pytest.approx(0.95)
    priced = record.price("liar", DraftTree.chain(3, [1, 1], [math.log(0.95)] * 2))
    assert np.allclose(np.exp(np.diff(priced.logprobs)), record.rate("liar", math.log(0.95)))


class FreeTreeDrafter(Drafter):
    n_vocab = 400

    def __init__(self):
        self.free = []

    def draft(self, context, spec, free=None):
        self.free.append(free)
        return DraftTree.root_only(context[-1])


def test_the_router_prices_a_source_by_what_the_target_emitted():
    """Prompt lookup proposes "8" after "1 2 3" from an earlier occurrence; the target goes on with
    "9" every time: lookup's step price falls below its stated level."""
    model = FreeTreeDrafter()
    route = DraftRouter(model, PromptLookupDrafter(400))
    context = [1, 2, 3, 8, 40, 41, 1, 2, 3]
    route.draft(context, DraftSpec("hybrid", 4))
    first = model.free[-1]
    for i in range(12):
        context = context + [9, 50 + i, 1, 2, 3]
        route.draft(context, DraftSpec("hybrid", 4))
    eights = [c for c in model.free[-1].children(0) if model.free[-1].tokens[c] == 8]
    was = [c for c in first.children(0) if first.tokens[c] == 8]
    assert was and (not eights or model.free[-1].logprobs[eights[0]] < first.logprobs[was[0]] - 0.5)
    route.forget()
    assert route.record.counts == {}
