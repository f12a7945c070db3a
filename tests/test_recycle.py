"""Token Recycling against naive references: the strided top-k against a full sort, the adjacency
against a table filled row by row, the BFS trees against an enumeration of every path, and the
free trees' merge."""

from __future__ import annotations


import numpy as np
import pytest
from scipy.special import log_softmax

from ondevice.draft.free_tree import merge_trees, point_mass_chain
from ondevice.draft.recycle import LEARN_ROWS, TOP_K, TokenRecycler, table_bytes, top_k_rows
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree


@pytest.mark.parametrize("vocab", [5, 64, 300, 1000, 4099, 151_936])
def test_top_k_rows_are_the_k_largest_logits(vocab):
    rng = np.random.default_rng(vocab)
    logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
    logits[1, rng.integers(0, vocab, 3)] += 20  # a peaked row
    tokens, logp = top_k_rows(logits, TOP_K)
    k = min(TOP_K, vocab)
    want = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(tokens, want)
    exact = log_softmax(logits.astype(np.float64), axis=1)
    got, ref = logp.astype(np.float64), np.take_along_axis(exact, want, 1)
    assert np.all(got >= ref - 1e-5) and np.all(got <= 1e-6)  # an upper bound of the probability ...
    assert np.all(got[1, :1] - ref[1, :1] < 0.01)  # ... tight where one token dominates


def naive_table(passes, rows_per_pass: int) -> dict[int, list[int]]:
    """token -> the argsort top-k of the last row read for it; per pass, path rows after the others."""
    table = {}
    for tree, logits, path in passes:
        others = [i for i in range(len(tree)) if i not in path]
        rows = (others[: max(0, rows_per_pass - len(path))] + list(path))[-rows_per_pass:]
        for i in rows:
            table[int(tree.tokens[i])] = np.argsort(-logits[i], kind="stable")[:TOP_K].tolist()
    return table


def random_tree(rng, vocab: int, n: int) -> DraftTree:
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree(rng.integers(0, vocab, n), np.array(parents), np.zeros(n))


@pytest.mark.parametrize("seed", range(4))
def test_the_adjacency_is_a_table_of_the_last_rows_seen(seed):
    rng = np.random.default_rng(seed)
    vocab = 40  # few tokens: rows are replaced, and tokens repeat within a tree
    recycler = TokenRecycler(vocab)
    passes = []
    for _ in range(12):
        tree = random_tree(rng, vocab, int(rng.integers(1, 30)))  # some trees with more nodes than LEARN_ROWS
        logits = rng.standard_normal((len(tree), vocab)).astype(np.float32)
        path = [0] + [i for i in range(1, len(tree)) if tree.parents[i] == 0][-1:]  # the last child: rows not contiguous
        recycler.learn(tree, logits, path)
        passes.append((tree, logits, path))
    table = naive_table(passes, LEARN_ROWS)
    for token in range(vocab):
        assert recycler.candidates(token)[0].tolist() == table.get(token, [])
    assert recycler.nbytes == vocab * TOP_K * 6 == table_bytes(vocab)  # what the memory plan leaves room for


def all_paths(recycler: TokenRecycler, root: int, depth: int) -> dict[tuple, float]:
    """Every path of up to `depth` steps through the adjacency, with its summed stored log-probs."""
    out, frontier = {}, [((), 0.0, root)]
    for _ in range(depth):
        nxt = []
        for path, score, last in frontier:
            for token, step in zip(*recycler.candidates(last)):
                item = (path + (int(token),), score + min(float(step), -1e-6), int(token))
                out[item[0]] = item[1]
                nxt.append(item)
        frontier = nxt
    return out


def tree_scores(tree: DraftTree) -> dict[tuple, float]:
    return {tuple(int(tree.tokens[n]) for n in tree.path_to(i)[1:]): float(tree.logprobs[i]) for i in range(1, len(tree))}


@pytest.mark.parametrize("budget", [1, 5, 30, 72, 200])
def test_bfs_tree_is_the_best_paths_through_the_adjacency(budget):
    rng = np.random.default_rng(budget)
    vocab = 12
    recycler = TokenRecycler(vocab)
    for _ in range(6):  # fill every row
        tree = DraftTree(np.arange(vocab), np.array([-1] + [0] * (vocab - 1)), np.zeros(vocab))
        recycler.learn(tree, (rng.standard_normal((vocab, vocab)) * 2).astype(np.float32), [0])
    drafted = recycler.draft([3, 7], DraftSpec("recycle", budget, max_depth=2))
    every = all_paths(recycler, 7, 2)  # 8 + 64 = 72 paths
    got = tree_scores(drafted)
    assert len(got) == min(budget, len(every)) and set(got) <= set(every)
    assert all(abs(got[p] - every[p]) < 1e-9 for p in got)
    left_out = [s for p, s in every.items() if p not in got]
    assert not left_out or max(left_out) <= min(got.values()) + 1e-12


def test_nothing_learned_nothing_proposed():
    recycler = TokenRecycler(100)
    assert len(recycler.draft([1, 2, 3], DraftSpec("recycle", 8))) == 1 and recycler.nbytes == 0


def test_sequoia_gets_the_best_chain_with_point_mass_q():
    rng = np.random.default_rng(0)
    recycler = TokenRecycler(10)
    tree = DraftTree(np.arange(10), np.array([-1] + [0] * 9), np.zeros(10))
    recycler.learn(tree, rng.standard_normal((10, 10)).astype(np.float32), [0])
    full = recycler.draft([4], DraftSpec("recycle", 6))
    chain = recycler.draft([4], DraftSpec("recycle", 6, temperature=1.0, sample_children=True))
    assert chain.parents.tolist() == list(range(-1, len(chain) - 1)) and set(chain.q) == set(range(len(chain) - 1))
    for node, q in chain.q.items():
        assert q.sum() == 1.0 and q[chain.tokens[node + 1]] == 1.0
    best_first_child = full.children(0)[int(np.argmax(full.logprobs[full.children(0)]))]
    assert chain.tokens[1] == full.tokens[best_first_child]


def test_merge_keeps_the_most_confident_step_of_each_path():
    a = DraftTree(np.array([1, 2, 3]), np.array([-1, 0, 1]), np.array([0.0, -0.5, -1.5]))
    b = DraftTree(np.array([1, 2, 4, 5]), np.array([-1, 0, 1, 0]), np.array([0.0, -0.2, -0.4, -3.0]))
    merged = tree_scores(merge_trees([a, b], budget=10))
    assert merged == pytest.approx({(2,): -0.2, (2, 3): -1.2, (2, 4): -0.4, (5,): -3.0})
    assert tree_scores(merge_trees([b, a], budget=10)) == pytest.approx(merged)  # whichever comes first
    assert set(tree_scores(merge_trees([a, b], budget=2))) == {(2,), (2, 4)}
    chain = point_mass_chain(merge_trees([a, b], budget=10), 6)
    assert chain.tokens.tolist() == [1, 2, 4]


def test_learning_is_cheap():
    """The engine calls learn after every pass: LEARN_ROWS rows of a real-sized vocabulary."""
    import time

    rng = np.random.default_rng(0)
    recycler = TokenRecycler(151_936)
    tree = random_tree(rng, 151_936, 64)
    logits = rng.standard_normal((64, 151_936)).astype(np.float32)
    recycler.learn(tree, logits, [0, 1])
    t0 = time.perf_counter()
    for _ in range(5):
        recycler.learn(tree, logits, [0, 1])
    per_pass = (time.perf_counter() - t0) / 5
    assert per_pass < 0.05, per_pass  # ~1 ms here; a loose bound for a loaded CI machine
