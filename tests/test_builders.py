"""Draft builders (draft/builders.py) against exact references on a synthetic LM whose next-token
logits depend on the last token only: best-first finds exactly the most likely nodes, chain follows
the argmax, multi-seq applies DuoDecoding's threshold, sampled trees record q."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from scipy.special import log_softmax

from ondevice.draft.builders import Round, build_best_first, build_chain, build_multi_seq
from ondevice.draft.model_drafter import check_spec
from ondevice.vocabtrim.head import KeptColumns
from ondevice.errors import OndeviceError
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree

# --- a synthetic LM: next-token logits depend on the last token only ---------------------------


class MarkovLM:
    """An `Expander` over a (vocab, vocab) logits table; records the batch size of every call."""

    columns = None

    def __init__(self, vocab: int = 24, scale: float = 2.5, seed: int = 0):
        self.table = (np.random.default_rng(seed).standard_normal((vocab, vocab)) * scale).astype(np.float32)
        self.batches: list[int] = []

    def expand(self, tree, nodes):
        self.batches.append(len(nodes))
        return self.table[[tree.tokens[n] for n in nodes]]

    def free_capacity(self) -> int:
        return 10**6

    def release(self, tree, alive) -> None:
        pass

    def logp(self, token: int) -> np.ndarray:
        return log_softmax(self.table[token].astype(np.float64))


def draft(lm: MarkovLM, root: int, builder: str, spread: float = 1.0, margin: float = 0.0, **spec) -> DraftTree:
    """margin 0 unless a test says otherwise: the exact search, which the references below check."""
    r = Round(DraftSpec(builder=builder, **spec), root, lm)
    root_logp = r.distributions([0], lm.table[[root]])[0]
    if builder == "chain":
        return build_chain(r, root_logp)
    if builder == "multi-seq":
        return build_multi_seq(r, root_logp)
    return build_best_first(r, root_logp, max_batch=8, spread=spread, margin=margin)


def token_paths(tree: DraftTree) -> set[tuple[int, ...]]:
    return {tuple(int(tree.tokens[n]) for n in tree.path_to(i)[1:]) for i in range(1, len(tree))}


def exact_top_nodes(lm: MarkovLM, root: int, budget: int, max_depth: int | None = None) -> set[tuple[int, ...]]:
    """The `budget` most likely nodes of the full tree (no deeper than max_depth): pop the best node,
    push all its children (fewer than `budget` if the depth-capped tree is smaller)."""
    heap, out, count = [(0.0, 0, ())], [], 1
    while len(out) < budget + 1 and heap:
        neg_lp, _, path = heapq.heappop(heap)
        out.append(path)
        if max_depth is not None and len(path) == max_depth:
            continue
        logp = lm.logp(path[-1] if path else root)
        for token, step in enumerate(logp):
            heapq.heappush(heap, (neg_lp - step, count, path + (token,)))
            count += 1
    return set(out[1:])


@pytest.mark.parametrize("budget", [1, 7, 40, 120])
@pytest.mark.parametrize("spread", [0.0, 1.0, np.inf])
def test_best_first_finds_exactly_the_most_likely_nodes(budget, spread):
    lm = MarkovLM()
    tree = draft(lm, 3, "best-first", spread=spread, budget=budget)
    assert len(tree) == budget + 1
    assert token_paths(tree) == exact_top_nodes(lm, 3, budget)


@pytest.mark.parametrize("max_depth", [1, 2, 4])
def test_best_first_honours_the_planned_depth(max_depth):
    """The planner prices trees of at most `depth` levels; the search it runs must stay within them
    and still find exactly the most likely nodes there."""
    lm = MarkovLM(scale=6.0)  # peaked: an unbounded search of 40 nodes goes 11 levels deep
    assert max(len(p) for p in exact_top_nodes(lm, 3, 40)) > 4
    tree = draft(lm, 3, "best-first", budget=40, max_depth=max_depth)
    assert tree.depths.max() <= max_depth
    assert token_paths(tree) == exact_top_nodes(lm, 3, 40, max_depth)


def test_best_first_expands_many_leaves_per_decode():
    lm = MarkovLM(scale=1.0)
    draft(lm, 5, "best-first", budget=64)
    assert max(lm.batches) == 8  # max_batch
    assert len(lm.batches) < 64 / 4 and sum(lm.batches) < 1.1 * 64  # few calls, little waste


def tree_mass(tree: DraftTree, lm: MarkovLM, root: int) -> float:
    """Sum over the tree's nodes of their probability under the LM (what the target accepts of a tree,
    were the LM the target: the expected tokens a pass)."""
    total = 0.0
    for path in token_paths(tree):
        tokens = (root, *path)
        total += float(np.exp(sum(lm.logp(a)[b] for a, b in zip(tokens, tokens[1:]))))
    return total


@pytest.mark.parametrize("scale", [1.5, 2.5, 4.0])
def test_a_leaf_margin_saves_rows_and_gives_up_little_of_the_tree(scale):
    """With a margin the search stops once every unexpanded kept node scores within `margin` of the
    weakest kept one; over several roots it decodes fewer rows than the exact search, for trees
    whose mass (the tokens a pass they would win) stays within a few percent."""
    budget, margin, rows, mass = 16, 0.5, {}, {}
    for m in (0.0, margin):
        lm = MarkovLM(scale=scale)
        mass[m] = 0.0
        for root in range(8):
            r = Round(DraftSpec(builder="best-first", budget=budget), root, lm)
            tree = build_best_first(r, r.distributions([0], lm.table[[root]])[0], max_batch=8, margin=m)
            kept = r.tree.best(budget, None)
            weakest = r.tree.scores[kept[-1]]
            assert all(r.tree.expanded[n] or r.tree.scores[n] <= weakest + m for n in kept)
            mass[m] += tree_mass(tree, lm, root)
        rows[m] = sum(lm.batches)
    assert rows[margin] < rows[0.0]
    assert mass[margin] >= 0.95 * mass[0.0]


def test_chain_follows_the_argmax():
    lm = MarkovLM()
    tree = draft(lm, 2, "chain", budget=6)
    token = 2
    for node in range(1, 7):
        token = int(np.argmax(lm.table[token]))
        assert tree.tokens[node] == token and tree.parents[node] == node - 1


def test_multi_seq_uses_the_duodecoding_threshold():
    seen_counts = set()
    for root in range(24):
        lm = MarkovLM(scale=1.0, seed=1)
        tree = draft(lm, root, "multi-seq", budget=12)
        root_p = np.exp(lm.logp(root))
        top1 = int(np.argmax(root_p))
        theta = root_p.max() * np.exp(lm.logp(top1)).max()
        n_seqs = int(np.clip((root_p > theta).sum(), 1, 8))
        heads = tree.children(0)
        assert sorted(int(tree.tokens[h]) for h in heads) == sorted(np.argsort(-root_p)[:n_seqs].tolist())
        for head in heads:  # each sequence is a greedy chain of budget // n_seqs tokens
            node, length = head, 1
            while tree.children(node):
                (child,) = tree.children(node)
                assert tree.tokens[child] == np.argmax(lm.table[tree.tokens[node]])
                node, length = child, length + 1
            assert length == 12 // n_seqs
        seen_counts.add(n_seqs)
    assert len(seen_counts) > 1  # the threshold really varies the number of sequences


def test_sampling_records_q_and_draws_distinct_children_reproducibly():
    lm = MarkovLM(scale=1.0)
    spec = dict(budget=30, temperature=0.7, sample_children=True, seed=11)
    tree = draft(lm, 4, "best-first", **spec)
    again = draft(MarkovLM(scale=1.0), 4, "best-first", **spec)
    assert np.array_equal(tree.tokens, again.tokens) and np.array_equal(tree.parents, again.parents)
    other = draft(MarkovLM(scale=1.0), 4, "best-first", **{**spec, "seed": 12})
    assert not np.array_equal(tree.tokens, other.tokens)
    for node in range(len(tree)):
        kids = [int(tree.tokens[c]) for c in tree.children(node)]
        assert len(kids) == len(set(kids))
        if kids:
            q = tree.q[node]
            assert q.shape == (24,) and abs(q.sum() - 1) < 1e-5
            expected = np.exp(log_softmax(lm.table[tree.tokens[node]].astype(np.float64) / 0.7))
            np.testing.assert_allclose(q, expected, rtol=1e-4, atol=1e-7)


class NarrowLM(MarkovLM):
    """MarkovLM's logits at the kept tokens only, as a trimmed drafter returns them."""

    def __init__(self, keep_ids: np.ndarray, **kw):
        super().__init__(**kw)
        self.columns = KeptColumns(keep_ids, len(self.table))

    def expand(self, tree, nodes):
        return super().expand(tree, nodes)[:, self.columns.keep_ids]


class MaskedLM(MarkovLM):
    """The same drafter with every column: -inf (probability 0) outside the kept tokens."""

    def __init__(self, keep_ids: np.ndarray, **kw):
        super().__init__(**kw)
        outside = np.ones(len(self.table), bool)
        outside[keep_ids] = False
        self.table[:, outside] = -np.inf


@pytest.mark.parametrize(
    "builder, spec",
    [
        ("best-first", dict(budget=30)),
        ("best-first", dict(budget=12, max_depth=3)),
        ("chain", dict(budget=6)),
        ("multi-seq", dict(budget=12)),
        ("best-first", dict(budget=20, temperature=0.8, sample_children=True, seed=5)),
        ("best-first", dict(budget=20, temperature=0.8, seed=5)),
    ],
)
def test_a_search_over_kept_columns_drafts_the_tree_of_full_width_logits(builder, spec):
    """A trimmed drafter's search ranks its K columns alone; the tree, its log-probs and its q must be
    those of the same logits spread over the whole vocabulary with -inf elsewhere."""
    keep = np.sort(np.random.default_rng(2).choice(24, 11, replace=False))
    narrow, masked = NarrowLM(keep, scale=1.5), MaskedLM(keep, scale=1.5)
    root = int(np.setdiff1d(np.arange(24), keep)[0])  # the context may end in a token the drafter never proposes
    trees = []
    for lm, root_row in ((narrow, narrow.table[[root]][:, keep]), (masked, masked.table[[root]])):
        r = Round(DraftSpec(builder=builder, **spec), root, lm)
        root_logp = r.distributions([0], root_row)[0]
        build = {"chain": build_chain, "multi-seq": build_multi_seq}.get(builder)
        trees.append(build(r, root_logp) if build else build_best_first(r, root_logp, max_batch=4))
    got, want = trees
    assert len(want) == spec["budget"] + 1 and set(want.tokens[1:].tolist()) <= set(keep.tolist())
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.parents, want.parents)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
    assert got.q.keys() == want.q.keys() and (len(want.q) > 0) == (spec.get("temperature", 0) > 0)
    for node, q in want.q.items():
        assert got.q[node].shape == (24,)
        np.testing.assert_allclose(got.q[node], q, atol=1e-6)


def test_spec_validation_of_the_depth():
    with pytest.raises(OndeviceError, match="depth"):
        check_spec(DraftSpec(builder="best-first", budget=8, max_depth=0))


def test_spec_validation():
    for bad in (DraftSpec(budget=0), DraftSpec(budget=2049), DraftSpec(builder="beam"), DraftSpec(temperature=-1)):
        with pytest.raises(OndeviceError):
            check_spec(bad)
    check_spec(DraftSpec(builder="best-first", budget=2048))
