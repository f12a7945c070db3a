"""ondevice/decode/kvcache.py, and the targets that keep their slots with it (torch, ONNX).

References: entries moved by hand, one at a time, from a copy of the arrays; and a target built
from scratch on the tokens a cache kept (after a commit or a rollback), whose logits the reused
cache must reproduce.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ondevice.errors import OndeviceError
from ondevice.decode.kvcache import CachedContext, TreeSlots, is_root_path, kept_prefix, move_entries
from ondevice.draft.search_tree import SearchTree
from ondevice.onnx import export as ex
from ondevice.onnx.decoder import OnnxDecoder
from ondevice.onnx.target import OnnxTarget
from ondevice.targets.torch_target import TorchTarget
from ondevice.decode.tree import DraftTree
from tiny_models import write_tiny_gguf

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
TREE = DraftTree(np.array([5, 8, 9, 7, 9, 3]), np.array([-1, 0, 0, 1, 1, 2]), np.zeros(6))  # root 5 = PROMPT[4]


def moved_by_hand(array: np.ndarray, src, dst: int) -> np.ndarray:
    before, after = array.copy(), array.copy()
    for i, s in enumerate(src):
        after[:, :, dst + i] = before[:, :, s]
    return after


@pytest.mark.parametrize("src, dst", [([4, 6, 7], 2), ([2, 3], 3), ([5], 5), ([7, 1, 4], 0)])
def test_move_entries_on_numpy_and_torch_equals_a_copy_moved_by_hand(src, dst):
    keys = np.random.default_rng(0).normal(size=(1, 2, 9, 4)).astype(np.float32)
    expected = moved_by_hand(keys, src, dst)
    as_numpy, as_torch = keys.copy(), torch.from_numpy(keys.copy())
    move_entries([as_numpy], np.array(src), dst)
    move_entries([as_torch], torch.tensor(src), dst)
    np.testing.assert_array_equal(as_numpy, expected)
    np.testing.assert_array_equal(as_torch.numpy(), expected)


def test_kept_prefix_never_keeps_the_last_token():
    assert kept_prefix([1, 2, 3], [1, 2, 3]) == 2  # its logits are needed: decoded again
    assert kept_prefix([1, 2, 3], [1, 2, 3, 4, 5]) == 3
    assert kept_prefix([1, 2, 3], [1, 7, 3, 4]) == 1
    assert kept_prefix([], [8]) == 0


def test_root_paths():
    parents = TREE.parents
    assert is_root_path(parents, np.array([0, 1, 4]))
    assert is_root_path(parents, np.array([0]))
    assert not is_root_path(parents, np.array([0, 2, 4]))  # 4 is 1's child
    assert not is_root_path(parents, np.array([1, 3]))  # not from the root
    assert not is_root_path(parents, np.array([0, 9]))  # no such node
    assert not is_root_path(np.zeros(0, np.int64), np.array([0]))  # no tree


def test_tree_slots_commit_moves_the_path_and_forgets_the_tree():
    slots, moves = TreeSlots(n_ctx=16), []
    slots.appended(5)
    slots.tree_written(TREE.parents)
    slots.commit([0, 1, 4], lambda src, dst: moves.append((src.tolist(), dst)))
    assert moves == [([5, 6, 9], 5)] and slots.n_cached == 8
    with pytest.raises(ValueError):  # the tree is gone: a second commit has nothing to keep
        slots.commit([0], lambda src, dst: None)
    slots.tree_written(TREE.parents)
    slots.truncate(3)
    assert slots.n_cached == 3 and len(slots.tree_parents) == 0
    with pytest.raises(ValueError):
        slots.truncate(4)
    with pytest.raises(OndeviceError, match="do not fit"):
        slots.check_room(14)
    slots.check_room(13)


def test_cached_context_accepts_the_expanded_nodes_the_context_goes_on_with():
    cache = CachedContext()
    cache.tokens = [3, 1, 4]
    cache.tree = tree = SearchTree(4)
    a, b = tree.add_children(0, np.array([7, 8]), np.array([-0.1, -0.2]))
    (c,) = tree.add_children(a, np.array([9]), np.array([-0.1]))
    assert cache.root_pos == 2
    assert cache.accepted_nodes([3, 1, 4, 7, 9, 5], cells={a, b, c}) == [a, c]
    assert cache.accepted_nodes([3, 1, 4, 7, 9], cells={a, b, c}) == [a]  # the last token is decoded again
    assert cache.accepted_nodes([3, 1, 4, 7, 9, 5], cells={a, b}) == [a]  # c holds no entry
    assert cache.accepted_nodes([3, 2, 4, 7, 9, 5], cells={a, b, c}) == []  # the context left the cache


# --- the targets that keep their slots with TreeSlots --------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("kv") / "tiny.gguf")


def torch_target(path):
    return TorchTarget.from_gguf(path, n_ctx=64)


def onnx_target(path):
    return OnnxTarget(OnnxDecoder(ex.ensure_export(path, accuracy_level=ex.ACCURACY_FP32, show=False), slots=64, threads=1), 64)


def next_logits(target, token: int) -> np.ndarray:
    return target.forward_tree(DraftTree.root_only(token))[0]


@pytest.mark.parametrize("make", [torch_target, onnx_target], ids=["torch", "onnx"])
def test_a_committed_path_equals_a_cache_built_from_scratch(tiny_path, make):
    target = make(tiny_path)
    target.prefill(PROMPT[:4])
    target.forward_tree(TREE)
    target.commit([0, 1, 4])  # 5, 8, 9 kept
    assert target.n_cached == 7
    fresh = make(tiny_path)
    fresh.prefill(PROMPT[:4] + [5, 8, 9])
    np.testing.assert_allclose(next_logits(target, 2), next_logits(fresh, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make", [torch_target, onnx_target], ids=["torch", "onnx"])
def test_a_rolled_back_cache_equals_one_built_from_scratch_on_the_kept_tokens(tiny_path, make):
    target = make(tiny_path)
    target.prefill(PROMPT)
    target.truncate(3)
    target.prefill([7, 7])
    fresh = make(tiny_path)
    fresh.prefill(PROMPT[:3] + [7, 7])
    np.testing.assert_allclose(next_logits(target, 2), next_logits(fresh, 2), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        target.commit([0, 1])  # the last tree was root-only
