"""LlamaTarget: one-pass tree verification, commit and truncate, against sequential decoding."""

from __future__ import annotations

import numpy as np
import pytest

from ondevice.errors import OndeviceError
from ondevice.target.llama_target import LlamaTarget, leaf_sequences
from ondevice.tree import DraftTree
from tiny_models import write_tiny_gguf

# root → a → b;  root → c → d;  c → e   (5 drafted nodes, 3 leaves)
SHAPE = [-1, 0, 1, 0, 3, 3]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", arch="qwen2", vocab=320)


def sequential_logits(target: LlamaTarget, prefix: list[int], tokens: list[int]) -> np.ndarray:
    """Reference: `prefix` in the cache (a target used with one prefix only), then `tokens` one at a time."""
    if target.n_cached < len(prefix):
        target.truncate(0)
        target.prefill(prefix)
    target.truncate(len(prefix))
    rows = []
    for token in tokens:
        rows.append(target.forward_tree(DraftTree.root_only(token))[0])
        target.commit([0])
    return np.array(rows)


def random_tree(n: int, vocab: int, seed: int) -> DraftTree:
    rng = np.random.default_rng(seed)
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    return DraftTree(rng.integers(0, vocab, n), np.array(parents), np.zeros(n))


def test_greedy_reference_is_the_engine_alone_and_stops_after_the_end_token(tiny_path):
    """eval.numerics.greedy_reference (VocabTrim calibration, exactness tests) against the engine
    decoding with the target alone: same tokens; with is_end it stops right after the first end."""
    from ondevice.engine import SpecEngine, Step
    from ondevice.eval.numerics import greedy_reference

    target, prompt = LlamaTarget(tiny_path, n_ctx=128, threads=1), [5, 60, 61, 7, 200]
    engine = SpecEngine(target, None, lambda token: False)
    alone = [t for item in engine.generate(prompt, 24) if isinstance(item, Step) for t in item.tokens]
    assert greedy_reference(target, prompt, 24) == alone
    end = alone[9]  # call the 10th token the end of the turn
    assert greedy_reference(target, prompt, 24, is_end=lambda token: token == end) == alone[: alone.index(end) + 1]


def test_leaf_sequences_tag_every_node_with_the_leaves_below():
    tree = DraftTree(np.arange(6), np.array(SHAPE), np.zeros(6))
    assert leaf_sequences(tree) == [[1, 2, 3], [1], [1], [2, 3], [2], [3]]


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_logits_equal_sequential_decoding_tiny(tiny_path, seed):
    target, ref = LlamaTarget(tiny_path, n_ctx=256, threads=1), LlamaTarget(tiny_path, n_ctx=256, threads=1)
    prefix = [5, 60, 61, 7, 200]
    tree = random_tree(40, 319, seed)
    target.prefill(prefix)
    logits = target.forward_tree(tree)
    assert logits.shape == (40, 320) and logits.dtype == np.float32
    for leaf in tree.leaves():
        path = tree.path_to(leaf)
        expected = sequential_logits(ref, prefix, [int(tree.tokens[n]) for n in path])
        np.testing.assert_allclose(logits[path], expected, atol=1e-3)  # f32 weights: batch-invariant to ~1e-5


def test_commit_keeps_only_the_path_tiny(tiny_path):
    target, ref = LlamaTarget(tiny_path, n_ctx=256, threads=1), LlamaTarget(tiny_path, n_ctx=256, threads=1)
    prefix = [9, 8, 7]
    tree = DraftTree(np.array([1, 2, 3, 4, 5, 6]), np.array(SHAPE), np.zeros(6))
    target.prefill(prefix)
    target.forward_tree(tree)
    target.commit([0, 3, 5])  # root, c, e
    assert target.n_cached == len(prefix) + 3
    after = target.forward_tree(DraftTree.chain(42, [43]))
    expected = sequential_logits(ref, prefix, [1, 4, 6, 42, 43])[-2:]
    np.testing.assert_allclose(after, expected, atol=1e-3)
    target.commit([0])
    target.truncate(len(prefix) + 1)  # drop c, e, 42: back to prefix + root
    again = target.forward_tree(DraftTree.root_only(77))
    np.testing.assert_allclose(again[0], sequential_logits(ref, prefix, [1, 77])[-1], atol=1e-3)


def test_uncommitted_tree_is_dropped_by_the_next_call(tiny_path):
    target, ref = LlamaTarget(tiny_path, n_ctx=256, threads=1), LlamaTarget(tiny_path, n_ctx=256, threads=1)
    target.prefill([4, 4, 4])
    target.forward_tree(random_tree(20, 319, 5))  # verified, never committed
    second = target.forward_tree(DraftTree.root_only(9))
    np.testing.assert_allclose(second[0], sequential_logits(ref, [4, 4, 4], [9])[0], atol=1e-3)
    assert target.n_cached == 3


def test_context_and_tree_limits_are_ondevice_errors(tiny_path):
    target = LlamaTarget(tiny_path, n_ctx=64, threads=1, max_tree_nodes=256)
    with pytest.raises(OndeviceError, match="does not fit the target's context"):
        target.prefill(list(range(65)))
    target.prefill(list(range(60)))
    with pytest.raises(OndeviceError, match="does not fit the target's context"):
        target.forward_tree(DraftTree.chain(1, [2, 3, 4, 5]))
    target.truncate(0)
    star = DraftTree(np.ones(257), np.array([-1] + [0] * 256), np.zeros(257))
    with pytest.raises(OndeviceError, match="lower the draft budget"):
        target.forward_tree(star)
    with pytest.raises(OndeviceError, match="does not exist"):
        LlamaTarget(tiny_path.parent / "missing.gguf")


def test_wide_tree_up_to_the_leaf_limit(tiny_path):
    target = LlamaTarget(tiny_path, n_ctx=512, threads=1)
    star = DraftTree(np.arange(256) % 300, np.array([-1] + [0] * 255), np.zeros(256))  # 255 leaves
    target.prefill([1, 2])
    logits = target.forward_tree(star)
    ref = LlamaTarget(tiny_path, n_ctx=512, threads=1)
    for leaf in (1, 128, 255):
        expected = sequential_logits(ref, [1, 2], [0, int(star.tokens[leaf])])[-1]
        np.testing.assert_allclose(logits[leaf], expected, atol=1e-3)
    target.commit([0, 200])
    assert target.n_cached == 4


# --- the real models --------------------------------------------------------------------------

PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="module")
def drafter_as_target(real_pair):
    """The 0.5B Q4_K_M file as a target: the same code path as the 1.5B, three times faster."""
    return real_pair.drafter


@pytest.mark.real
def test_small_tree_is_bit_exact_with_sequential_decoding(drafter_as_target):
    """Batches of <= 7 tokens take the same CPU kernels as single tokens: the mask must be exact."""
    from ondevice.tokenizer import Tokenizer

    prefix = Tokenizer(drafter_as_target).encode(PROMPT)
    target, ref = LlamaTarget(drafter_as_target, n_ctx=256, threads=2), LlamaTarget(drafter_as_target, n_ctx=256, threads=2)
    tree = DraftTree(np.array([prefix[-1], 421, 308, 470, 1000, 2000]), np.array(SHAPE), np.zeros(6))
    target.prefill(prefix[:-1])
    logits = target.forward_tree(tree)
    for leaf in tree.leaves():
        path = tree.path_to(leaf)
        expected = sequential_logits(ref, prefix[:-1], [int(tree.tokens[n]) for n in path])
        np.testing.assert_array_equal(logits[path], expected)


@pytest.mark.real
def test_large_tree_matches_sequential_decoding_within_batch_noise(drafter_as_target):
    """Batches of >= 8 tokens use other kernels: logits move by up to ~0.5 (measured), argmax only at near-ties."""
    from ondevice.tokenizer import Tokenizer

    prefix = Tokenizer(drafter_as_target).encode(PROMPT)
    target, ref = LlamaTarget(drafter_as_target, n_ctx=256, threads=2), LlamaTarget(drafter_as_target, n_ctx=256, threads=2)
    tree = random_tree(24, 20000, seed=7)
    tree.tokens[0] = prefix[-1]
    target.prefill(prefix[:-1])
    logits = target.forward_tree(tree)
    for leaf in tree.leaves()[:2]:
        path = tree.path_to(leaf)
        expected = sequential_logits(ref, prefix[:-1], [int(tree.tokens[n]) for n in path])
        assert np.abs(logits[path] - expected).max() < 1.0
        for row, exp in zip(logits[path], expected):
            top2 = np.sort(exp)[-2:]
            assert row.argmax() == exp.argmax() or top2[1] - top2[0] < 0.35
