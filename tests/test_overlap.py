"""Overlap (draft the next tree while the target verifies): DraftTree.subtree, the guess, and exactness.

The reference is always the target alone (same engine, root-only trees, no drafter): with overlap
on, greedy output must be token for token the same, and SpecExec sampling too (one target draw per
emitted token, whatever the tree). The tiny models are f32 GGUFs, batch-invariant to ~1e-5.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from ondevice.decode.engine import SpecEngine, Stats
from ondevice.decode.stats import collect
from ondevice.decode.overlap import Guess, prepared_spec
from ondevice.decode.protocols import DraftSpec, Drafter
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling, Verdict
from tiny_models import write_tiny_gguf

# --- DraftTree.subtree ---------------------------------------------------------------------------

#        0 (10)
#      /        \
#   1 (11)     2 (12)
#     |       /   |    \
#   3 (13)  4(14) 5(15) 7(17)
#             |
#           6 (16)
PARENTS = [-1, 0, 0, 1, 2, 2, 4, 2]
STEPS = [0.0, -0.5, -1.0, -0.2, -0.3, -0.9, -0.1, -2.0]  # per-step draft log-probs


def hand_tree() -> DraftTree:
    cum = [0.0] * len(PARENTS)
    for i in range(1, len(PARENTS)):
        cum[i] = cum[PARENTS[i]] + STEPS[i]
    tree = DraftTree(np.arange(10, 18), np.array(PARENTS), np.array(cum))
    tree.q = {0: np.full(4, 0.25), 2: np.array([0.1, 0.2, 0.3, 0.4]), 4: np.array([1.0, 0, 0, 0])}
    return tree


def test_subtree_rerooted_at_an_inner_node():
    sub = hand_tree().subtree(2)
    # by hand: 2→0, 4→1, 5→2, 6→3, 7→4
    assert sub.tokens.tolist() == [12, 14, 15, 16, 17]
    assert sub.parents.tolist() == [-1, 0, 0, 1, 0]
    assert sub.depths.tolist() == [0, 1, 1, 2, 1]
    np.testing.assert_allclose(sub.logprobs, [0.0, -0.3, -0.9, -0.4, -2.0])
    assert sorted(sub.q) == [0, 1]
    np.testing.assert_array_equal(sub.q[0], [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(sub.q[1], [1.0, 0, 0, 0])
    expected_mask = np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 0, 0, 1],
    ], dtype=bool)  # fmt: skip
    np.testing.assert_array_equal(sub.ancestor_mask(), expected_mask)
    assert sub.children(0) == [1, 2, 4]  # siblings keep their (draw) order


def test_subtree_of_a_chain_link_and_of_a_leaf_and_of_the_root():
    tree = hand_tree()
    chain = tree.subtree(1)
    assert chain.tokens.tolist() == [11, 13] and chain.parents.tolist() == [-1, 0] and chain.q == {}
    np.testing.assert_allclose(chain.logprobs, [0.0, -0.2])
    leaf = tree.subtree(6)
    assert leaf.tokens.tolist() == [16] and leaf.parents.tolist() == [-1] and leaf.logprobs.tolist() == [0.0]
    whole = tree.subtree(0)
    assert whole.tokens.tolist() == tree.tokens.tolist() and whole.parents.tolist() == tree.parents.tolist()
    np.testing.assert_allclose(whole.logprobs, tree.logprobs)
    assert sorted(whole.q) == [0, 2, 4]


def test_likely_path_follows_the_best_child():
    # root's best child is 1 (−0.5 > −1.0), then 3; cumulative log-probs would prefer nothing else here
    assert hand_tree().likely_path() == [0, 1, 3]
    assert DraftTree.root_only(5).likely_path() == [0]


def test_guess_is_used_only_when_the_whole_path_and_a_prepared_child_come_true():
    prepared = DraftTree(np.array([13, 40, 41, 42]), np.array([-1, 0, 0, 1]), np.array([0.0, -0.1, -2.0, -0.3]))
    guess = Guess([0, 1, 3], prepared)
    nxt = guess.next_tree(Verdict([0, 1, 3], [11, 13, 40]))
    assert nxt is not None and nxt.tokens.tolist() == [40, 42] and nxt.parents.tolist() == [-1, 0]
    assert guess.next_tree(Verdict([0, 1, 3], [11, 13, 41])).tokens.tolist() == [41]
    assert guess.next_tree(Verdict([0, 1, 3], [11, 13, 99])) is None  # bonus not drafted
    assert guess.next_tree(Verdict([0, 1], [11, 40])) is None  # path stopped early
    assert guess.next_tree(Verdict([0, 2], [12, 40])) is None  # another branch


def test_prepared_spec_respects_the_window_and_the_token_limit():
    spec = DraftSpec("chain", 4)
    assert prepared_spec(spec, room_after=100, tokens_left_after=10).budget == 5  # + the level re-rooting drops
    assert prepared_spec(spec, room_after=3, tokens_left_after=10).budget == 3  # next round may draft 2
    assert prepared_spec(spec, room_after=1, tokens_left_after=10) is None
    assert prepared_spec(spec, room_after=100, tokens_left_after=0) is None
    assert prepared_spec(DraftSpec("best-first", 2048), 10_000, 10).budget == 2048
    assert prepared_spec(DraftSpec("best-first", 16, max_depth=3), 100, 10).max_depth == 4  # re-rooted: depth ≤ 3


# --- the engine on tiny GGUF models ----------------------------------------------------------------

PROMPTS = [[5, 60, 61, 7, 200, 33], [300, 12, 12, 99, 140, 141, 142, 17, 250]]
SPECS = [DraftSpec("chain", 4), DraftSpec("best-first", 12), DraftSpec("multi-seq", 8)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    sharp = dict(arch="llama", head_scale=3.0)  # peaked enough for deep trees, varied output
    write_tiny_gguf(d / "target.gguf", **sharp)
    write_tiny_gguf(d / "twin.gguf", dtype="f16", **sharp)  # the target in f16: nearly always agrees
    write_tiny_gguf(d / "noisy.gguf", noise=0.1, **sharp)  # agrees often: accepted paths of every length
    return d


@pytest.fixture(scope="module")
def target(tiny_dir):
    from ondevice.targets.llama_target import LlamaTarget

    return LlamaTarget(tiny_dir / "target.gguf", n_ctx=256, threads=1)


@pytest.fixture(scope="module")
def drafters(tiny_dir):
    from ondevice.draft.llama_drafter import LlamaDrafter

    return {name: LlamaDrafter(tiny_dir / f"{name}.gguf", n_ctx=256, threads=1) for name in ("twin", "noisy")}


def decode(engine: SpecEngine, prompt, n, spec=None, sampling=Sampling(), rule="specexec") -> tuple[list[int], Stats]:
    engine.cached = []
    return collect(engine.generate(prompt, n, sampling, spec, rule))


def never_ends(token: int) -> bool:
    return False


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.builder}@{s.budget}")
@pytest.mark.parametrize("drafter_name", ["twin", "noisy"])
def test_greedy_overlap_equals_target_alone(target, drafters, drafter_name, spec):
    alone = SpecEngine(target, None, never_ends)
    plain = SpecEngine(target, drafters[drafter_name], never_ends, overlap=False)
    duo = SpecEngine(target, drafters[drafter_name], never_ends, overlap=True)
    for prompt in PROMPTS:
        reference, _ = decode(alone, prompt, 40)
        out_plain, stats_plain = decode(plain, prompt, 40, spec)
        out_duo, stats = decode(duo, prompt, 40, spec)
        assert out_plain == reference and out_duo == reference
        assert stats_plain.overlap_hits == 0 and stats_plain.prepared_trees == 0
        assert stats.prepared_trees > 0 and stats.overlap_hits <= stats.prepared_trees
        assert stats.concurrent_seconds >= 0 and stats.overhead_seconds > -1e-3
        if drafter_name == "twin" and spec.builder != "best-first":  # the guess is usually right: most rounds need no drafting
            # (a best-first search is carried instead: what it saves depends on how long each pass lasts)
            assert stats.overlap_hits >= stats.target_passes // 2, stats


def test_prepared_chain_is_the_chain_a_fresh_draft_makes(target, drafters):
    """With a twin drafter nearly every round uses the prepared tree, and accepts as many tokens."""
    plain = SpecEngine(target, drafters["twin"], never_ends)
    duo = SpecEngine(target, drafters["twin"], never_ends, overlap=True)
    _, stats_plain = decode(plain, PROMPTS[0], 40, SPECS[0])
    _, stats = decode(duo, PROMPTS[0], 40, SPECS[0])
    assert stats.overlap_hits >= stats.target_passes - 2
    assert stats.accepted_per_pass == stats_plain.accepted_per_pass


def test_overlap_up_to_the_end_of_the_context_window(tiny_dir, drafters):
    from ondevice.targets.llama_target import LlamaTarget

    small = LlamaTarget(tiny_dir / "target.gguf", n_ctx=48, threads=1)
    reference, _ = decode(SpecEngine(small, None, never_ends), PROMPTS[1], 1000)
    for spec in SPECS:
        out, stats = decode(SpecEngine(small, drafters["twin"], never_ends, overlap=True), PROMPTS[1], 1000, spec)
        assert out == reference and stats.finish_reason == "length" and len(out) == 48 - len(PROMPTS[1])
        assert stats.prepared_trees > 0 and (spec.builder == "best-first" or stats.overlap_hits > 0)  # carried: timing-dependent


@pytest.mark.parametrize("spec", SPECS[:2], ids=lambda s: f"{s.builder}@{s.budget}")
def test_specexec_sampling_with_overlap_draws_the_same_tokens_as_the_target_alone(target, drafters, spec):
    sampling = Sampling(temperature=0.8, seed=3)
    spec = DraftSpec(spec.builder, spec.budget, temperature=0.8, seed=3)
    reference, _ = decode(SpecEngine(target, None, never_ends), PROMPTS[0], 40, sampling=sampling)
    out, stats = decode(SpecEngine(target, drafters["twin"], never_ends, overlap=True), PROMPTS[0], 40, spec, sampling)
    assert out == reference and stats.prepared_trees > 0 and (spec.builder == "best-first" or stats.overlap_hits > 0)


def test_sequoia_verifies_prepared_trees_with_their_q(target, drafters):
    """Sequoia's rule needs q at every expanded node (it raises otherwise): the subtree carries it over."""
    sampling = Sampling(temperature=0.8, seed=5)
    spec = DraftSpec("best-first", 12, temperature=0.8, sample_children=True, seed=5)
    engine = SpecEngine(target, drafters["twin"], never_ends, overlap=True)
    hits = sum(decode(engine, prompt, 40, spec, sampling, rule="sequoia")[1].overlap_hits for prompt in PROMPTS)
    assert hits > 0


class FailingDrafter(Drafter):
    """Raises while the target is (slowly) verifying: the engine must wait for the pass, then raise."""

    n_vocab = 320

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def draft(self, context, spec):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("drafter failed")
        return self.inner.draft(context, spec)


class SlowTarget:
    def __init__(self, inner):
        self.inner, self.finished = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_tree(self, tree):
        time.sleep(0.05)
        logits = self.inner.forward_tree(tree)
        self.finished += 1
        return logits


def test_a_drafter_error_waits_for_the_target_pass(target, drafters):
    slow = SlowTarget(target)
    engine = SpecEngine(slow, FailingDrafter(drafters["noisy"]), never_ends, overlap=True)
    with pytest.raises(RuntimeError, match="drafter failed"):
        decode(engine, PROMPTS[0], 20, SPECS[0])
    assert slow.finished == 1  # the pass that ran beside the failing draft had finished


# --- the real pair -----------------------------------------------------------------------------------


@pytest.mark.real
def test_overlap_on_the_real_pair_equals_target_alone(real_pair):
    """llama.cpp target + drafter, chain @4, 2 prompts × 32 tokens: the target alone's tokens, except
    at near-ties (top-2 margin below this machine's batch noise for passes of 5 tokens)."""
    from ondevice.bench import prompt_sets as prompts
    from ondevice.eval.numerics import greedy_misses, pass_noise
    from ondevice.draft.llama_drafter import LlamaDrafter
    from ondevice.targets.llama_target import LlamaTarget
    from ondevice.prompt.tokenizer import Tokenizer

    tokenizer = Tokenizer(real_pair.target)
    target = LlamaTarget(real_pair.target, n_ctx=1024, threads=2)
    drafter = LlamaDrafter(real_pair.drafter, n_ctx=1024, threads=2)
    alone = SpecEngine(target, None, tokenizer.is_end)
    duo = SpecEngine(target, drafter, tokenizer.is_end, overlap=True)
    hits = 0
    for text in (prompts.CODE_EVAL[0], prompts.CHAT_EVAL[0]):
        ids = tokenizer.encode_user(text)
        reference, _ = decode(alone, ids, 32)
        out, stats = decode(duo, ids, 32, DraftSpec("chain", 4))
        if out != reference:
            noise = pass_noise(target, ids, reference, range(2, 6))  # passes of <= 5 tokens
            assert not greedy_misses(target, ids, out, noise)[1], f"diverged, not at near-ties (noise {noise:.3f})"
        hits += stats.overlap_hits
    assert hits > 0
