"""Sequoia's DP against brute force over every tree, and the hardware-aware choice on synthetic curves."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree
from ondevice.draft.builders import Round, build_best_first
from ondevice.plan.acceptance import AcceptanceTracker, default_p_rank
from ondevice.plan.cost_model import best_first_batches, choose_plan
from ondevice.plan.curve import Curves, LatencyCurve, powers_of_two
from ondevice.plan.sequoia import SequoiaTable, chain_tokens_per_pass, optimal_tree, tree_tokens_per_pass

P_VECTORS = [
    [0.86, 0.077, 0.031, 0.012],
    [0.5, 0.3, 0.1],
    [0.3, 0.5, 0.1],  # not sorted: children must still take ranks 0, 1, 2… in order
    [0.95],
]


def all_trees(max_nodes: int, depth: int, p: list[float]) -> list[tuple[int, float]]:
    """(nodes, E[accepted + 1]) of every tree with ≤ max_nodes nodes and depth ≤ depth, by enumeration.
    A node's children are its rank 0, 1, …, b−1 children; a subtree's value is 1 + Σ_c p[c]·value(c)."""

    def forests(rank: int, room: int):  # children of rank ≥ `rank` using ≤ room nodes
        yield 0, 0.0
        if rank >= len(p) or room == 0:
            return
        for size, value in all_trees(room, depth - 1, p):
            for rest_size, rest_value in forests(rank + 1, room - size):
                yield size + rest_size, p[rank] * value + rest_value

    if depth == 0:
        return [(1, 1.0)]
    return [(1 + size, 1.0 + value) for size, value in forests(0, max_nodes - 1)]


@pytest.mark.parametrize("p", P_VECTORS)
def test_dp_matches_brute_force(p):
    table = SequoiaTable(p, max_budget=6, max_depth=4)
    for m in range(1, 8):
        for depth in range(0, 5):
            brute = max(value for _, value in all_trees(m, depth, p))
            assert table.tokens_per_pass(m - 1, depth) == pytest.approx(brute, abs=1e-12), (m, depth)


@pytest.mark.parametrize("p", P_VECTORS + [list(default_p_rank())])
def test_reconstructed_shape_achieves_the_table(p):
    table = SequoiaTable(p, max_budget=64, max_depth=8)
    for budget in (1, 2, 5, 7, 16, 64):
        for depth in (1, 2, 3, 8):
            shape = table.shape(budget, depth)
            assert shape.budget <= budget and shape.depth <= depth
            assert tree_tokens_per_pass(shape.parents, shape.ranks, p) == pytest.approx(table.tokens_per_pass(budget, depth))
            DraftTree(np.zeros(len(shape.parents)), shape.parents, np.zeros(len(shape.parents)))  # valid topological order
            for node in range(len(shape.parents)):  # each node's children are ranks 0, 1, …, b−1 in order
                children = np.flatnonzero(shape.parents == node)
                assert shape.ranks[children].tolist() == list(range(len(children)))
            assert list(shape.depths) == sorted(shape.depths)  # breadth-first


def test_chain_closed_form_and_dp_agree():
    for p1 in (0.3, 0.86, 0.99):
        table = SequoiaTable([p1], max_budget=20, max_depth=20)
        for k in (1, 2, 5, 20):
            explicit = 1 + sum(p1**i for i in range(1, k + 1))
            assert chain_tokens_per_pass(p1, k) == pytest.approx(explicit)
            assert table.tokens_per_pass(k, k) == pytest.approx(explicit)
            assert table.shape(k, k).parents.tolist() == list(range(-1, k))  # one child each: a chain


def test_trees_beat_chains_and_grow_with_budget():
    p = default_p_rank()
    last = 0.0
    for budget in powers_of_two(256):
        tree = optimal_tree(p, budget, 16)
        assert tree.tokens_per_pass >= chain_tokens_per_pass(p[0], min(budget, 16)) - 1e-12
        assert tree.tokens_per_pass >= last
        last = tree.tokens_per_pass


# --- the hardware-aware choice ----------------------------------------------------------------
def curve(points: dict[int, float]) -> LatencyCurve:
    return LatencyCurve(tuple(points), tuple(points.values()))


LLAMA_CPU_TARGET = curve({1: 0.080, 4: 0.094, 8: 0.177, 16: 0.216, 32: 0.366, 64: 0.684})  # DESIGN.md, 1.5B
LLAMA_CPU_DRAFTER = curve({1: 0.034, 4: 0.048, 8: 0.070, 16: 0.106, 32: 0.208, 64: 0.321})  # DESIGN.md, 0.5B


@pytest.mark.parametrize("overlap", [False, True])
def test_flat_offloaded_target_gets_a_big_tree(overlap):
    target = curve({n: 1.5 + 1e-5 * n for n in powers_of_two(1024)})  # streaming weights: ~1.5 s at any n
    drafter = curve({b: 0.02 + 0.001 * b for b in powers_of_two(128)})
    plan = choose_plan(Curves(target, drafter), default_p_rank(), overlap_possible=overlap)
    assert plan.builder == "best-first" and plan.budget >= 64
    assert plan.predicted_speedup > 4 and plan.fallback_reason is None and plan.overlap == overlap


# the default pair under 0.9 GB on a 2-core AVX-512 EPYC, its LM head kept (the streaming profile's passes)
STREAMED_CPU_TARGET = curve({1: 0.418, 2: 0.422, 4: 0.431, 8: 0.456, 9: 0.456, 16: 0.456, 17: 0.483, 32: 0.487})
TRIMMED_CPU_DRAFTER = curve({1: 0.017, 2: 0.031, 4: 0.039, 8: 0.069, 16: 0.12, 32: 0.23})  # its trimmed 0.5B drafter, 2 threads


def test_a_disk_bound_cpu_target_gets_a_tree_of_at_least_8_nodes():
    """Where a streamed pass costs about the same for 1 or 16 nodes, small trees waste the pass (on
    a CPU in RAM the same pair gets 8 nodes or fewer: the test below)."""
    plan = choose_plan(Curves(STREAMED_CPU_TARGET, TRIMMED_CPU_DRAFTER), default_p_rank(), overlap_possible=False)
    assert plan.builder == "best-first" and plan.budget + 1 >= 8
    assert plan.predicted_tokens_per_pass > 4 and plan.predicted_speedup > 3


def test_steep_cpu_target_gets_a_small_tree_or_none():
    plan = choose_plan(Curves(LLAMA_CPU_TARGET, LLAMA_CPU_DRAFTER), default_p_rank(), overlap_possible=False)
    assert plan.budget <= 8
    slow_drafter = curve({b: 0.060 * b**0.5 for b in powers_of_two(64)})
    plan = choose_plan(Curves(LLAMA_CPU_TARGET, slow_drafter), default_p_rank(), overlap_possible=False)
    assert plan.budget <= 4


# the default pair's target streamed on a 2-core AVX2 VM: llama.cpp's batched kernels work in tiles
# of 8/16 tokens, so a pass costs a step function of its size (2^k and 2^k + 1 timed, as profiles do)
STEPPED = curve({1: 0.55, 2: 0.58, 3: 0.61, 4: 0.64, 5: 0.67, 8: 0.92, 9: 0.93, 16: 0.94, 17: 1.16, 32: 1.20, 33: 1.44, 64: 1.77})


def test_a_stepped_target_fills_a_pass_to_the_tile_edge():
    drafter = curve({b: 0.015 + 0.006 * b for b in powers_of_two(128)})
    plan = choose_plan(Curves(STEPPED, drafter), [0.9, 0.05, 0.02, 0.01], overlap_possible=False)
    assert plan.budget + 1 in (8, 16, 32, 64), plan  # one node more would cost a step: 17 nodes are 23% dearer than 16
    assert plan.predicted_speedup > 2


def test_drafter_slower_than_target_falls_back_with_a_reason():
    drafter = curve({1: 0.120, 64: 0.900})
    plan = choose_plan(Curves(LLAMA_CPU_TARGET, drafter), default_p_rank(), overlap_possible=False)
    assert plan.builder == "target-only" and plan.budget == 0 and plan.draft_spec() is None
    assert "slower" in plan.fallback_reason
    assert plan.predicted_tokens_per_second == pytest.approx(1 / 0.080)


def test_poor_acceptance_falls_back():
    plan = choose_plan(Curves(LLAMA_CPU_TARGET, LLAMA_CPU_DRAFTER), [0.2, 0.05], overlap_possible=False)
    assert plan.budget == 0 and "does not pay" in plan.fallback_reason


def test_overlap_never_predicts_slower():
    curves = Curves(LLAMA_CPU_TARGET, LLAMA_CPU_DRAFTER)
    seq = choose_plan(curves, default_p_rank(), overlap_possible=False)
    par = choose_plan(curves, default_p_rank(), overlap_possible=True)
    assert par.predicted_tokens_per_second >= seq.predicted_tokens_per_second


# --- acceptance tracking ----------------------------------------------------------------------
def test_default_prior_matches_the_calibration():
    p = default_p_rank()
    assert p[0] == pytest.approx(0.86) and p[:4].sum() == pytest.approx(0.98)
    assert np.all(np.diff(p) <= 0) and p.sum() <= 1


def test_tracker_learns_and_handles_censoring():
    tracker = AcceptanceTracker(prior_weight=10, decay=1.0)
    assert tracker.p_rank == pytest.approx(default_p_rank())
    for _ in range(200):  # chains whose only child is rejected: rank 0 looks worse, rank 1 unseen
        tracker.observe_node(1, None)
    assert tracker.p_rank[0] < 0.1
    hazard_1 = tracker.p_rank[1] / (1 - tracker.p_rank[0])
    assert hazard_1 == pytest.approx(default_p_rank()[1] / (1 - 0.86))  # still the prior's
    for _ in range(400):
        tracker.observe_node(4, 2)
    assert np.argmax(tracker.p_rank) == 2


def test_tracker_ranks_children_by_draft_logprob():
    # root → children 1, 2, 3 with draft log-probs −2.0, −0.1, −1.0: ranks 2, 0, 1
    tree = DraftTree(np.array([5, 6, 7, 8, 9]), np.array([-1, 0, 0, 0, 3]), np.array([0, -2.0, -0.1, -1.0, -1.5]))
    tracker = AcceptanceTracker(decay=1.0)
    tracker.observe(tree, [0, 3, 4])  # rank 1 at the root, then rank 0 at node 3, node 4 is a leaf
    assert tracker.accepted.tolist()[:2] == [1, 1]
    assert tracker.at_risk.tolist()[:3] == [2, 1, 0]
    tracker.observe(tree, [0])  # nothing accepted: all three root children were at risk
    assert tracker.at_risk.tolist()[:3] == [3, 2, 1]


def test_tracker_persists_per_pair(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    tracker = AcceptanceTracker()
    tracker.observe_node(3, 1)
    path = tracker.save("pair-a")
    assert path.is_relative_to(tmp_path)
    assert AcceptanceTracker.load("pair-a").p_rank == pytest.approx(tracker.p_rank)
    assert AcceptanceTracker.load("pair-b").p_rank == pytest.approx(default_p_rank())
    assert tracker.drift(default_p_rank()) > 0


def test_a_round_pays_for_decoding_the_accepted_leaf():
    """The first draft call of a round decodes the bonus token and, when the whole chain was
    accepted, the last drafted token (proposed, never decoded): a batch of 2 with p[0]^budget."""
    target = curve({1: 0.1, 2: 0.1, 4: 0.1})
    drafter = curve({1: 0.01, 2: 0.05, 4: 0.06})
    p_rank = np.array([0.9, 0.05, 0.02, 0.01])
    plan = choose_plan(Curves(target, drafter), p_rank, overlap_possible=False, budgets=[1], max_depth=1)
    assert plan.builder in ("chain", "best-first") and plan.budget == 1
    draft = 0.01 + 0.9 * (0.05 - 0.01)  # one call, plus the catch-up when the drafted token was accepted
    assert plan.predicted_tokens_per_second == pytest.approx(plan.predicted_tokens_per_pass / (draft + 0.1))


class SameEverywhere:
    """A drafter whose every node's children are tokens 0, 1, … with probabilities p (token i: rank i)."""

    columns = None

    def __init__(self, p: np.ndarray, vocab: int = 64):
        self.row = np.full(vocab, -30.0)
        self.row[: len(p)] = np.log(p)
        self.calls: list[int] = []

    def expand(self, tree, nodes):
        self.calls.append(len(nodes))
        return np.tile(self.row, (len(nodes), 1))

    def free_capacity(self) -> int:
        return 10_000

    def release(self, tree, alive) -> None:
        pass


@pytest.mark.parametrize("p", [[0.86, 0.077, 0.031, 0.012, 0.005], [0.6, 0.2, 0.1, 0.05, 0.03], [0.4, 0.25, 0.15, 0.1, 0.05]])
@pytest.mark.parametrize("budget", [4, 8, 15, 31, 63])
def test_best_first_is_priced_by_the_calls_its_search_makes(p, budget):
    """The cost model prices best-first's drafting by the calls the real builder makes (draft/builders.py,
    every kept node expanded, in score order, a call per BATCH_SPREAD band), not one per level of the
    shape: on a steep p (code) a 15-node tree is ~14 calls of one node. (The exact search: with its leaf
    margin the search makes at most these calls, next test.)"""
    p = np.asarray(p) / np.sum(p)
    drafter = SameEverywhere(p)
    tree = build_best_first(Round(DraftSpec("best-first", budget), 0, drafter), drafter.row.copy(), max_batch=64, margin=0.0)
    ranks = tree.tokens.copy()
    ranks[0] = -1
    calls = [1, *drafter.calls]  # the root's distribution came from the call before (the target's token decoded)
    priced = best_first_batches(SimpleNamespace(parents=tree.parents, ranks=ranks), p)
    assert len(priced) == len(calls)  # the same calls, one after the other
    assert sum(priced) == pytest.approx(sum(calls), rel=0.25)  # (the builder also expands nodes it prunes later)
    if p[0] > 0.8 and budget <= 15:
        assert len(priced) >= budget  # a call per node: the root, then every node the search keeps but the last


@pytest.mark.parametrize("p", [[0.86, 0.077, 0.031, 0.012, 0.005], [0.6, 0.2, 0.1, 0.05, 0.03], [0.4, 0.25, 0.15, 0.1, 0.05]])
@pytest.mark.parametrize("budget", [4, 8, 15, 31, 63])
def test_the_price_bounds_the_search_with_its_leaf_margin(p, budget):
    """The search that runs leaves the nodes near the weakest kept one unexpanded: never more calls or
    rows than the exact search the cost model prices."""
    p = np.asarray(p) / np.sum(p)
    exact, margined = SameEverywhere(p), SameEverywhere(p)
    build_best_first(Round(DraftSpec("best-first", budget), 0, exact), exact.row.copy(), max_batch=64, margin=0.0)
    build_best_first(Round(DraftSpec("best-first", budget), 0, margined), margined.row.copy(), max_batch=64)
    assert len(margined.calls) <= len(exact.calls) and sum(margined.calls) <= sum(exact.calls)
