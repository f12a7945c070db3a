"""Hybrid trees (free proposals + the drafter's best-first search, one budget).

References: the exact best nodes of the union tree, found by enumerating a Markov LM's full tree with
each step the higher of the model's and the free source's; the drafter model's own distribution
after each node, computed by a second drafter that decodes the node's whole path as context.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from scipy.special import log_softmax

from ondevice.draft import hybrid
from ondevice.draft.builders import Round
from ondevice.draft.hybrid import build_hybrid
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree
from test_builders import MarkovLM, MaskedLM, NarrowLM, exact_top_nodes, token_paths
from tiny_models import write_tiny_gguf


class RecordingLM(MarkovLM):
    """The Markov LM, also recording which nodes (as token paths) each call decoded."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls: list[list[tuple[int, ...]]] = []

    def expand(self, tree, nodes):
        self.calls.append([tuple(tree.tokens[n] for n in tree.path(n)[1:]) for n in nodes])
        return super().expand(tree, nodes)


def free_tree(root: int, paths: dict[tuple[int, ...], float]) -> DraftTree:
    """A free proposal from {token path: step log-prob} (every prefix of a path listed before it)."""
    ids = {(): 0}
    tokens, parents, logprobs = [root], [-1], [0.0]
    for path, step in paths.items():
        ids[path] = len(tokens)
        tokens.append(path[-1])
        parents.append(ids[path[:-1]])
        logprobs.append(logprobs[ids[path[:-1]]] + step)
    return DraftTree(np.array(tokens), np.array(parents), np.array(logprobs))


def random_free(rng, vocab: int, n: int, low: float = -3.0) -> dict[tuple[int, ...], float]:
    paths: dict[tuple[int, ...], float] = {}
    while len(paths) < n:
        parent = list(paths)[int(rng.integers(len(paths)))] if paths and rng.random() < 0.7 else ()
        child = parent + (int(rng.integers(vocab)),)
        if child not in paths:
            paths[child] = float(rng.uniform(low, -0.01))
    return paths


def run_hybrid(lm, root: int, free: dict, budget: int, max_depth=None, max_batch: int = 8, root_row=None, margin: float = 0.0) -> DraftTree:
    """margin 0 unless a test says otherwise: the exact search, which the references here check."""
    r = Round(DraftSpec("hybrid", budget, max_depth=max_depth), root, lm)
    root_logp = r.distributions([0], lm.table[[root]] if root_row is None else root_row)[0]
    return build_hybrid(r, root_logp, free_tree(root, free), max_batch, margin=margin)


def union_top_nodes(lm: MarkovLM, root: int, free: dict, budget: int, max_depth=None) -> dict[tuple[int, ...], float]:
    """The `budget` best nodes of the model's full tree with every free path's step raised to the
    free step where that is higher, and their scores: pop the best node, push all its children."""
    heap, out, tie = [(0.0, 0, ())], {}, 1
    while heap and len(out) < budget + 1:
        neg, _, path = heapq.heappop(heap)
        out[path] = -neg
        if max_depth is not None and len(path) == max_depth:
            continue
        logp = lm.logp(path[-1] if path else root)
        for token, step in enumerate(logp):
            step = max(step, free.get(path + (token,), -math.inf))
            heapq.heappush(heap, (neg - step, tie, path + (token,)))
            tie += 1
    del out[()]
    return out


def tree_scores(tree: DraftTree) -> dict[tuple, float]:
    return {tuple(int(tree.tokens[n]) for n in tree.path_to(i)[1:]): float(tree.logprobs[i]) for i in range(1, len(tree))}


@pytest.mark.parametrize("budget", [1, 7, 40])
def test_without_free_proposals_it_is_the_best_first_tree(budget):
    lm = MarkovLM()
    assert token_paths(run_hybrid(lm, 3, {}, budget)) == exact_top_nodes(lm, 3, budget)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [4, 25])
def test_with_nothing_covered_it_is_the_best_nodes_of_the_union(seed, budget, monkeypatch):
    monkeypatch.setattr(hybrid, "COVER_P", 2.0)  # no free step reaches it: every kept node may be expanded
    rng = np.random.default_rng(seed)
    lm = MarkovLM(seed=seed)
    free = random_free(rng, 24, 30, low=-1.5)
    likely, token = (), 5
    for _ in range(4):  # the model's own argmax run, proposed with little confidence: the model lifts it, all below included
        token = int(np.argmax(lm.table[token]))
        likely += (token,)
        free[likely] = free.get(likely, -4.0)
        free[likely + ((token + 1) % 24,)] = -0.5
    tree = run_hybrid(lm, 5, free, budget, max_depth=4 if seed % 2 else None)
    want = union_top_nodes(lm, 5, free, budget, max_depth=4 if seed % 2 else None)
    got = tree_scores(tree)  # every node's score: the free steps, lifted (with all below) where the model says more
    assert set(got) == set(want) and all(abs(got[p] - want[p]) < 1e-5 for p in want)


def test_free_ids_the_drafter_lacks_are_left_out():
    lm = RecordingLM(vocab=24)
    tree = run_hybrid(lm, 3, {(30,): CONFIDENT, (30, 4): CONFIDENT, (5,): -0.1, (5, 31): -0.1, (5, 31, 6): -0.1}, budget=12)
    assert all(max(p) < 24 for p in token_paths(tree)) and (5,) in token_paths(tree)


@pytest.mark.parametrize("seed", range(4))
def test_a_trimmed_drafter_s_kept_columns_give_the_tree_of_its_full_width_logits(seed, monkeypatch):
    """The drafter's children come from its K columns mapped to token ids; free proposals of any id
    the vocabulary has stay (a trimmed drafter's vocabulary is the full one, its columns fewer)."""
    monkeypatch.setattr(hybrid, "COVER_P", 2.0)
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(24, 10, replace=False))
    free = random_free(rng, 24, 20, low=-1.5)
    narrow, masked = NarrowLM(keep, seed=seed), MaskedLM(keep, seed=seed)
    got = run_hybrid(narrow, 5, free, 16, root_row=narrow.table[[5]][:, keep])
    want = run_hybrid(masked, 5, free, 16)
    assert any(t not in keep for t in got.tokens[1:]) and set(tree_scores(got)) == set(tree_scores(want))
    assert all(abs(tree_scores(got)[p] - s) < 1e-5 for p, s in tree_scores(want).items())


@pytest.mark.parametrize("seed", range(30))
def test_the_tree_never_exceeds_its_budget_or_depth(seed):
    rng = np.random.default_rng(seed)
    lm = RecordingLM(vocab=16, scale=float(rng.uniform(0.5, 6.0)), seed=seed)
    free = random_free(rng, 16, int(rng.integers(1, 80)), low=float(rng.choice([-0.2, -3.0])))
    budget = int(rng.integers(1, 60))
    max_depth = [None, 1, 3][seed % 3]
    tree = run_hybrid(lm, int(rng.integers(16)), free, budget, max_depth, max_batch=int(rng.integers(1, 9)))
    assert 1 <= len(tree) <= budget + 1
    assert max_depth is None or tree.depths.max() <= max_depth
    assert max_depth is None or all(len(p) < max_depth for call in lm.calls for p in call)  # no node at the last level is decoded
    siblings = [(int(tree.parents[i]), int(tree.tokens[i])) for i in range(1, len(tree))]
    assert len(set(siblings)) == len(siblings)  # no token twice under one parent
    DraftTree(tree.tokens, tree.parents, tree.logprobs)  # parents first
    assert np.all(tree.logprobs[1:] <= tree.logprobs[tree.parents[1:]] + 1e-12)  # a child never above its parent


CONFIDENT = math.log(0.95)


def test_a_confident_free_run_is_not_expanded_for_its_own_sake(monkeypatch):
    """Budget 4 and a 6-token free run at 0.95 per token: the first four tokens are the tree. The
    run covers every node on it, so the drafter decodes none of them (it would only add siblings)."""
    lm = RecordingLM(scale=1.0)  # flat: no model child comes near 0.95
    run = {tuple(range(10, 10 + i)): CONFIDENT for i in range(1, 7)}
    tree = run_hybrid(lm, 3, run, budget=4)
    assert token_paths(tree) == set(list(run)[:4]) and lm.calls == []
    monkeypatch.setattr(hybrid, "COVER_P", 2.0)
    lm_all = RecordingLM(scale=1.0)
    run_hybrid(lm_all, 3, run, budget=4)
    assert sum(len(c) for c in lm_all.calls) == 3  # without skipping, each of them but the last (the threshold) is expanded


def test_the_drafter_deepens_past_a_free_run_in_one_call():
    lm = RecordingLM(scale=6.0)  # peaked: the model's continuation of the run is kept too
    run = {tuple(range(10, 10 + i)): CONFIDENT for i in range(1, 7)}
    tree = run_hybrid(lm, 3, run, budget=30, max_batch=16)
    assert set(run) <= token_paths(tree)
    first = lm.calls[0]
    assert list(run) == [p for p in first if p in run]  # the whole run, top-down, in the first call
    below = {p for p in token_paths(tree) if len(p) > 6 and p[:6] == list(run)[-1]}
    assert below  # and the tree goes on below the run's end


# --- the real drafter's cache: nodes decoded together with their undecoded parents ------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "d.gguf", arch="llama", head_scale=3.0)


def drafters(tiny_path, kind: str):
    if kind == "llama":
        return LlamaDrafter(tiny_path, n_ctx=256, threads=1), LlamaDrafter(tiny_path, n_ctx=256, threads=1)
    from ondevice.draft.onnx_drafter import OnnxDrafter
    from ondevice.onnx import export as ex

    return tuple(OnnxDrafter(tiny_path, n_ctx=256, threads=1, accuracy_level=ex.ACCURACY_FP32, show=False) for _ in range(2))


@pytest.mark.parametrize("kind", ["llama", "onnx"])
def test_distributions_after_a_run_decoded_in_one_call_are_the_models(tiny_path, kind):
    """Every node the hybrid search expanded (runs decoded with their parents in one call) carries
    the drafter's distribution after its path: compare with a second drafter given that path as context."""
    drafter, reference = drafters(tiny_path, kind)
    context = [5, 60, 61, 7, 200, 33, 5, 60]
    runs = free_tree(context[-1], {(61,): CONFIDENT, (61, 7): CONFIDENT, (61, 7, 200): CONFIDENT, (61, 9): -2.0,
                                   (250,): -0.5, (250, 251): CONFIDENT, (250, 251, 252): CONFIDENT,
                                   (90,): -0.3, (90, 91): -0.2, (90, 92): -0.3})  # two undecoded children of 90
    spec = DraftSpec("hybrid", 24, temperature=1.0)  # q is recorded for every expanded node
    tree = drafter.draft(context, spec, runs)
    assert len(tree.q) >= 4 and max(tree.depths[n] for n in tree.q) >= 2
    for node, q in tree.q.items():
        path = [int(t) for t in tree.tokens[tree.path_to(node)[1:]]]
        want = np.exp(log_softmax(reference.cache.sync(context + path).astype(np.float64)))
        np.testing.assert_allclose(q, want, atol=2e-4, err_msg=f"after {path}")
    assert len(tree) <= 25 and {(90, 91), (90, 92)} <= token_paths(tree)
