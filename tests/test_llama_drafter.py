"""LlamaDrafter on tiny and real GGUFs (the builders on a synthetic LM: test_builders.py)."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from scipy.special import log_softmax

from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.errors import OndeviceError
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree
from test_builders import token_paths
from tiny_models import write_tiny_gguf

# --- LlamaDrafter on a tiny random GGUF (f32: batch-invariant to ~1e-5) -------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", arch="qwen2", vocab=320)


@pytest.fixture(scope="module")
def tiny_drafter(tiny_path) -> LlamaDrafter:
    return LlamaDrafter(tiny_path, n_ctx=256, threads=1, max_batch=16)


def fresh_root_logits(drafter: LlamaDrafter, context: list[int]) -> np.ndarray:
    drafter.cache.reset()
    return np.array(drafter.cache.sync(context))


@pytest.mark.parametrize("builder", ["chain", "best-first", "multi-seq"])
def test_next_round_keeps_the_accepted_nodes(tiny_drafter, builder):
    context = [11, 200, 37, 90, 5]
    tree = tiny_drafter.draft(context, DraftSpec(builder=builder, budget=24))
    expanded = [n for n in range(1, len(tree)) if tree.children(n)]
    deepest = max(expanded, key=lambda n: tree.depths[n])
    accepted = [int(tree.tokens[n]) for n in tree.path_to(deepest)[1:]]
    new_context = context + accepted + [7]  # + the target's bonus token
    tiny_drafter.draft(new_context, DraftSpec(builder=builder, budget=24))
    assert tiny_drafter.cache.last_sync_decoded == 1  # only the bonus token was decoded
    reused = np.array(tiny_drafter.cache.sync(new_context))
    np.testing.assert_allclose(reused, fresh_root_logits(tiny_drafter, new_context), atol=1e-3)


def test_best_first_on_llama_cpp_equals_exhaustive_search(tiny_drafter, tiny_path, monkeypatch):
    """Branches on many path sequences, pruned and released between batches, still give exactly the
    most likely nodes, scored independently by a LlamaTarget decoding each path (the exact search:
    no leaf left unexpanded for its margin)."""
    monkeypatch.setattr(tiny_drafter, "leaf_margin", 0.0)
    context, budget, temperature = [3, 1, 4, 1, 5], 60, 5.0
    tree = tiny_drafter.draft(context, DraftSpec(builder="best-first", budget=budget, temperature=temperature))
    assert len(tree.leaves()) > 10 and tree.depths.max() > 3  # a real tree, not a chain or a star
    assert token_paths(tree) == scored_top_paths(tiny_path, context, budget, temperature)


def scored_top_paths(model_path, context: list[int], budget: int, temperature: float) -> set[tuple[int, ...]]:
    """The `budget` most likely token paths after `context`, each path scored by a LlamaTarget
    decoding it (the independent reference for the drafter's best-first search)."""
    from ondevice.targets.llama_target import LlamaTarget

    scorer = LlamaTarget(model_path, n_ctx=256, threads=1)
    scorer.prefill(context[:-1])

    def logp(path: tuple[int, ...]) -> np.ndarray:
        logits = scorer.forward_tree(DraftTree.chain(context[-1], list(path)))[-1]
        return log_softmax(logits.astype(np.float64) / temperature)

    heap, best, count = [(0.0, 0, ())], [], 1
    while len(best) < budget + 1:
        neg_lp, _, path = heapq.heappop(heap)
        best.append(path)
        for token, step in enumerate(logp(path)):
            heapq.heappush(heap, (neg_lp - step, count, path + (token,)))
            count += 1
    scorer.close()
    return set(best[1:])


def test_release_cuts_branches_and_later_expansions_still_see_their_path(tiny_drafter, tiny_path):
    from ondevice.draft.search_tree import SearchTree
    from ondevice.targets.llama_target import LlamaTarget

    cache, context = tiny_drafter.cache, [8, 6, 7, 5]
    cache.sync(context)
    search = SearchTree(context[-1])
    a, c = search.add_children(0, np.array([30, 31]), np.array([-0.1, -0.2]))
    b, d = search.add_children(a, np.array([40, 41]), np.array([-0.1, -0.2]))
    cache.expand(search, [a, c])
    cache.expand(search, [b, d])  # b extends a's sequence, d gets a new one
    assert len(cache.path_end) == 3
    cache.release(search, {0, a})  # b, c, d die; a stays (on one sequence)
    assert len(cache.path_end) == 1 and set(cache.node_seq) == {a}
    (seq,) = cache.path_end
    assert tiny_drafter.ctx.seq_pos_max(seq) == cache.root_pos + 1
    (e,) = search.add_children(a, np.array([42]), np.array([-0.3]))
    got = np.array(cache.expand(search, [e])[0])
    scorer = LlamaTarget(tiny_path, n_ctx=256, threads=1)
    scorer.prefill(context[:-1])
    expected = scorer.forward_tree(DraftTree.chain(context[-1], [30, 42]))[-1]
    np.testing.assert_allclose(got, expected, atol=1e-3)


def test_rolled_back_context_is_not_reused(tiny_drafter):
    tiny_drafter.draft([1, 2, 3, 4], DraftSpec(builder="chain", budget=4))
    tiny_drafter.draft([1, 2, 9, 9, 9], DraftSpec(builder="chain", budget=4))
    assert tiny_drafter.cache.last_sync_decoded == 3
    assert tiny_drafter.cache.tokens == [1, 2, 9, 9, 9]


def test_huge_budget_releases_dead_branches(tiny_drafter):
    tree = tiny_drafter.draft([3, 1, 4, 1, 5], DraftSpec(builder="best-first", budget=600))
    assert len(tree) == 601
    assert len(tiny_drafter.cache.node_seq) <= 600  # cells of pruned nodes were freed
    assert tiny_drafter.cache.free_capacity() > 0


def test_best_first_stops_gracefully_when_llama_cpp_runs_out_of_sequences(tiny_drafter):
    """A flat distribution keeps > 255 expanded branches alive: drafting ends with the best found so far."""
    tree = tiny_drafter.draft([3, 1, 4, 1, 5], DraftSpec(builder="best-first", budget=1500, temperature=50.0))
    assert len(tree) == 1501
    assert tiny_drafter.cache.free_capacity() == 0 and len(tiny_drafter.cache.path_end) == tiny_drafter.ctx.n_seq_max - 1
    next_tree = tiny_drafter.draft([3, 1, 4, 1, 5, 9], DraftSpec(builder="chain", budget=3))  # the next round is fine
    assert len(next_tree) == 4


def test_probe_batch_leaves_the_cache_as_it_was(tiny_drafter):
    tiny_drafter.draft([5, 6, 7], DraftSpec(builder="chain", budget=2))
    tiny_drafter.probe_batch(32)
    assert tiny_drafter.cache.tokens == [5, 6, 7] and not tiny_drafter.cache.path_end
    assert tiny_drafter.cache.free_capacity() == tiny_drafter.ctx.n_seq_max - 1
    assert tiny_drafter.ctx.seq_pos_max(0) == 2


def test_vocab_trimmed_drafter_drafts_the_full_models_best_kept_tokens(tmp_path):
    from ondevice.vocabtrim.build import build_trimmed
    from ondevice.targets.llama_target import LlamaTarget

    path = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2", vocab=320)
    keep = np.union1d(np.arange(0, 320, 3), [*range(256, 320, 2), 319])  # some bytes, some merges, the EOS
    build_trimmed(path, keep, "test")
    drafter = LlamaDrafter(path, n_ctx=128, threads=1, vocab_trim=True)
    assert drafter.vocab_trimmed and drafter.n_vocab == 320
    context = [11, 200, 37, 90, 5]  # inputs outside the kept set are fine (embeddings of the full model)
    tree = drafter.draft(context, DraftSpec(builder="chain", budget=6))
    reference = LlamaTarget(path, n_ctx=128, threads=1)  # the untrimmed model
    reference.prefill(context[:-1])
    chain = [context[-1]]
    for _ in range(6):
        logits = reference.forward_tree(DraftTree.chain(chain[0], chain[1:]))[-1]
        chain.append(int(keep[np.argmax(logits[keep])]))
    assert tree.tokens.tolist() == chain


def test_context_longer_than_n_ctx_is_an_ondevice_error(tiny_drafter):
    with pytest.raises(OndeviceError, match="context tokens"):
        tiny_drafter.draft(list(range(300)), DraftSpec())


# --- the real drafter (Qwen2.5-Coder-0.5B Q4_K_M) ----------------------------------------------

PROMPT = "<|im_start|>user\nWrite a Python function that checks whether a number is prime.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def real_drafter(real_pair) -> LlamaDrafter:
    return LlamaDrafter(real_pair.drafter, n_ctx=512, threads=2)


@pytest.fixture(scope="module")
def prompt_ids(real_pair) -> list[int]:
    from ondevice.prompt.tokenizer import Tokenizer

    return Tokenizer(real_pair.drafter).encode(PROMPT)


def llama_cpp_greedy(path, prompt: list[int], n: int, logits_all: bool = False):
    """llama-cpp-python's own high-level generator (greedy), loaded with the same crash guard."""
    import llama_cpp

    from ondevice.machine.repack_layouts import weight_layout_guard

    with weight_layout_guard(path):  # the weight layout ondevice's loads use on this CPU: the same kernels
        llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=2, n_threads_batch=2, n_batch=512,
                              type_k=0, type_v=0, logits_all=logits_all, verbose=False)  # fmt: skip
    if logits_all:
        return llm
    out = []
    for token in llm.generate(prompt, temp=0.0, top_k=1):
        out.append(int(token))
        if len(out) == n:
            return out


@pytest.mark.real
def test_chain_equals_llama_cpp_greedy_generation(real_pair, real_drafter, prompt_ids):
    tree = real_drafter.draft(prompt_ids, DraftSpec(builder="chain", budget=8))
    reference = llama_cpp_greedy(real_pair.drafter, prompt_ids, 8)
    ours = tree.tokens[1:].tolist()
    if ours != reference:  # the prompt is read in other batches: allowed only at a near-tie of llama.cpp's logits
        from ondevice.eval.numerics import pass_noise
        from ondevice.decode.reference import greedy_reference
        from ondevice.targets.llama_target import LlamaTarget

        i = next(i for i, (a, b) in enumerate(zip(ours, reference)) if a != b)
        llm = llama_cpp_greedy(real_pair.drafter, prompt_ids, 0, logits_all=True)
        llm.eval(prompt_ids + reference[:i])
        top2 = np.sort(llm.scores[llm.n_tokens - 1])[-2:]
        target = LlamaTarget(real_pair.drafter, n_ctx=512, threads=2)
        noise = pass_noise(target, prompt_ids, greedy_reference(target, prompt_ids, 48), range(2, len(prompt_ids) + 1))
        assert top2[1] - top2[0] < noise, f"chain diverges from llama.cpp at step {i} without a near-tie ({noise:.3f})"


@pytest.mark.real
def test_best_first_tree_on_the_real_drafter(real_drafter, prompt_ids):
    budget = 32
    tree = real_drafter.draft(prompt_ids, DraftSpec(builder="best-first", budget=budget))
    search = real_drafter.cache.tree  # every node proposed this round
    assert len(tree) == budget + 1
    kept = token_paths(tree)
    proposed = {tuple(search.tokens[n] for n in search.path(i)[1:]): search.logprobs[i] for i in range(1, len(search))}
    weakest_kept = min(proposed[p] for p in kept)
    left_out = [lp for p, lp in proposed.items() if p not in kept]
    assert not left_out or max(left_out) <= weakest_kept
    # the greedy chain's nodes that are clearly likelier than the weakest kept node are in the tree
    # (margin: the chain is decoded one token at a time, the tree in batches: other numerics)
    chain = real_drafter.draft(prompt_ids, DraftSpec(builder="chain", budget=budget))
    likely = [n for n in range(1, len(chain)) if chain.logprobs[n] > weakest_kept + 1.0]
    assert len(likely) >= 3
    for node in likely:
        assert tuple(chain.tokens[1 : node + 1].tolist()) in kept


@pytest.mark.real
def test_multi_seq_on_the_real_drafter(real_drafter, prompt_ids):
    for budget in (8, 24):
        tree = real_drafter.draft(prompt_ids, DraftSpec(builder="multi-seq", budget=budget))
        heads = tree.children(0)
        assert 1 <= len(heads) <= 8
        assert all(len(tree.children(n)) <= 1 for n in range(1, len(tree)))  # sequences never branch
        assert len(tree) - 1 == (budget // len(heads)) * len(heads)
        assert np.all(np.diff(tree.logprobs[heads]) <= 0)  # heads are the likeliest first tokens


@pytest.mark.real
def test_sampled_tree_carries_q_on_the_real_drafter(real_drafter, prompt_ids):
    spec = DraftSpec(builder="best-first", budget=16, temperature=0.8, sample_children=True, seed=3)
    tree = real_drafter.draft(prompt_ids, spec)
    assert len(tree) == 17
    for node in range(len(tree)):
        if tree.children(node):
            q = tree.q[node]
            assert q.shape == (real_drafter.n_vocab,) and abs(float(q.sum()) - 1) < 1e-3
            assert all(q[tree.tokens[c]] > 0 for c in tree.children(node))
