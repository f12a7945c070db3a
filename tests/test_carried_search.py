"""A best-first search grown while the target verifies, carried to the next round (SpecExec's reuse).

References: the exact top-`budget` nodes of the drafter's full tree (a Markov LM's table, or paths
scored one by one by a LlamaTarget on the same tiny GGUF), and a fresh draft of the same context.
"""

from __future__ import annotations

import pytest

from ondevice.draft.builders import Round, build_best_first
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.decode.protocols import DraftSpec
from test_builders import MarkovLM, exact_top_nodes, token_paths
from test_llama_drafter import scored_top_paths
from tiny_models import write_tiny_gguf


def grow(r: Round, alive: set[int], batches: int, batch: int = 8) -> list[int]:
    """What ModelDrafter.grow does, for an expander without a cache: expand the best unexpanded nodes."""
    grown = []
    for _ in range(batches):
        frontier = r.tree.unexpanded(batch, alive)
        if not frontier:
            break
        for node, logp in zip(frontier, r.expand(frontier)):
            r.add(node, logp, r.tree.k)
        alive.update(frontier)
        grown += frontier
    return grown


@pytest.mark.parametrize("budget", [6, 20])
@pytest.mark.parametrize("pick", ["best", "deepest", "worst"])
def test_a_carried_search_gives_the_most_likely_nodes_below_the_new_root(budget, pick):
    lm = MarkovLM(vocab=24, scale=2.0, seed=3)
    r = Round(DraftSpec("best-first", budget), 5, lm)
    build_best_first(r, r.distributions([0], lm.table[[5]])[0], max_batch=8, margin=0.0)
    alive = {0} | {n for n, done in enumerate(r.tree.expanded) if done}
    grown = grow(r, alive, batches=4)
    assert grown
    by = {"best": lambda n: r.tree.scores[n], "deepest": lambda n: r.tree.depths[n], "worst": lambda n: -r.tree.scores[n]}
    root = max(grown, key=by[pick])
    carried, new_id = r.tree.subtree(root, alive)
    assert carried.tokens[0] == r.tree.tokens[root] and carried.expanded[0]
    lm.batches.clear()
    r2 = Round(DraftSpec("best-first", budget), carried.tokens[0], lm, tree=carried)
    tree = build_best_first(r2, None, max_batch=8, margin=0.0)
    assert token_paths(tree) == exact_top_nodes(lm, carried.tokens[0], budget)
    fresh = Round(DraftSpec("best-first", budget), carried.tokens[0], lm)
    build_best_first(fresh, fresh.distributions([0], lm.table[[carried.tokens[0]]])[0], max_batch=8, margin=0.0)
    assert r2.expansions <= fresh.expansions  # the carried expansions are not done again
    if pick == "best":  # the best grown node's own children were grown too
        assert r2.expansions < fresh.expansions


def test_subtree_keeps_only_usable_nodes_and_rebases_scores():
    lm = MarkovLM(vocab=12, seed=1)
    r = Round(DraftSpec("best-first", 8), 2, lm)
    build_best_first(r, r.distributions([0], lm.table[[2]])[0], max_batch=8, margin=0.0)
    expanded = {n for n, done in enumerate(r.tree.expanded) if done}
    child = r.tree.best(1)[0]
    carried, new_id = r.tree.subtree(child, expanded)
    for old, new in new_id.items():
        assert carried.tokens[new] == r.tree.tokens[old]
        assert carried.depths[new] == r.tree.depths[old] - r.tree.depths[child]
        assert carried.logprobs[new] == pytest.approx(r.tree.logprobs[old] - r.tree.logprobs[child])
        assert carried.expanded[new] == (old in expanded)
        assert old == child or r.tree.parents[old] in expanded
    for node in range(len(carried)):  # every expanded node has all its k candidates as children
        if carried.expanded[node]:
            assert len([c for c in range(len(carried)) if carried.parents[c] == node]) == carried.k


# --- LlamaDrafter: the carried KV cells on a tiny GGUF (f32: batch-invariant to ~1e-5) --------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", arch="qwen2", vocab=320)


@pytest.fixture(scope="module")
def drafter(tiny_path) -> LlamaDrafter:
    return LlamaDrafter(tiny_path, n_ctx=256, threads=1, max_batch=16, max_tree=64, leaf_margin=0.0)  # the exact search the references check


def stop_after(calls: int):
    count = iter(range(calls + 1))
    return lambda: next(count, calls) >= calls


def grown_context(drafter: LlamaDrafter, context: list[int], spec: DraftSpec, batches: int) -> tuple[list[int], int]:
    """Draft, grow `batches` batches, and return the context that ends on the deepest grown node."""
    drafter.draft(context, spec)
    search = drafter.last_round.tree
    before = {n for n, done in enumerate(search.expanded) if done}
    assert drafter.grow(stop_after(batches)) > 0
    grown = [n for n in drafter.cache.expanded() if n not in before and n != 0]
    node = max(grown, key=lambda n: (search.depths[n], search.scores[n]))
    return context + [search.tokens[n] for n in search.path(node)[1:]], len(grown)


def test_carried_draft_equals_exhaustive_search_scored_by_the_target(drafter, tiny_path):
    spec = DraftSpec("best-first", 30, temperature=5.0)
    context, _ = grown_context(drafter, [3, 1, 4, 1, 5], spec, batches=3)
    tree = drafter.draft(context, spec)
    assert drafter.cache.last_sync_decoded == 0 and drafter.carried_fraction > 0  # nothing decoded again
    assert token_paths(tree) == scored_top_paths(tiny_path, context, spec.budget, spec.temperature)


def test_carried_cache_matches_a_fresh_one(drafter):
    spec = DraftSpec("best-first", 16)
    context, _ = grown_context(drafter, [9, 8, 7, 6], spec, batches=2)
    carried = drafter.draft(context, spec)
    kv = drafter.cache
    assert kv.tokens == context and drafter.ctx.seq_pos_max(0) == len(context) - 1
    held = set(kv.path_end) | set(kv.free_seqs)
    assert held == set(range(1, drafter.ctx.n_seq_max)) and not set(kv.path_end) & set(kv.free_seqs)
    kv.reset()
    fresh = drafter.draft(context, spec)
    assert drafter.carried_fraction == 0.0
    assert token_paths(carried) == token_paths(fresh)


def test_a_bonus_token_the_drafter_did_not_expand_is_drafted_afresh(drafter):
    spec = DraftSpec("best-first", 12)
    context = [1, 2, 3]
    tree = drafter.draft(context, spec)
    search = drafter.last_round.tree
    drafter.grow(stop_after(1))
    unexpanded = next(n for n in range(1, len(search)) if not search.expanded[n])
    drafter.draft(context + [search.tokens[n] for n in search.path(unexpanded)[1:]], spec)
    assert drafter.carried_fraction == 0.0 and drafter.cache.last_sync_decoded == 1
    assert len(tree) == 13


def test_grow_stops_at_the_planned_tree_size(tiny_path):
    small = LlamaDrafter(tiny_path, n_ctx=128, threads=1, max_batch=8, max_tree=20)
    small.draft([5, 6, 7], DraftSpec("best-first", 8, temperature=3.0))
    small.grow(lambda: False)
    assert len(small.cache.expanded()) <= 20
    small.close()


def test_sampled_searches_are_not_grown(drafter):
    spec = DraftSpec("best-first", 8, temperature=0.8, sample_children=True, seed=1)
    assert not drafter.grows(spec) and drafter.grows(DraftSpec("best-first", 8, temperature=0.8))
    drafter.draft([4, 4, 4], spec)
    assert drafter.grow(lambda: False) == 0


@pytest.mark.parametrize("max_depth", [1, 2])
def test_a_carried_search_honours_the_planned_depth(max_depth):
    """The grown nodes below the new root go deeper than the plan's depth: they are not drafted."""
    lm = MarkovLM(vocab=16, scale=3.0, seed=5)
    spec = DraftSpec("best-first", 10, max_depth=max_depth)
    r = Round(spec, 1, lm)
    build_best_first(r, r.distributions([0], lm.table[[1]])[0], max_batch=8, margin=0.0)
    alive = {0} | {n for n, done in enumerate(r.tree.expanded) if done}
    grown = grow(r, alive, batches=6)
    root = max(grown, key=lambda n: r.tree.scores[n])
    carried, _ = r.tree.subtree(root, alive)
    assert max(carried.depths) > max_depth
    tree = build_best_first(Round(spec, carried.tokens[0], lm, tree=carried), None, max_batch=8, margin=0.0)
    assert tree.depths.max() <= max_depth
    assert token_paths(tree) == exact_top_nodes(lm, carried.tokens[0], 10, max_depth)
