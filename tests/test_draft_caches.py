"""The drafters' KV caches: draft/tree_cache.py (llama.cpp sequences) and draft/onnx_cache.py
(ONNX slots), on a tiny model written here.

The reference is a fresh cache of the same model synced to the same context: a cache that
expanded a tree, kept the accepted nodes' entries, rolled back or pruned must give the same
logits (llama.cpp and ONNX Runtime batch differently, hence a tolerance far below what a wrong
entry moves).
"""

from __future__ import annotations

import numpy as np
import pytest

from ondevice.draft.onnx_cache import OnnxDraftKV
from ondevice.draft.search_tree import SearchTree
from ondevice.draft.tree_cache import DraftKV
from ondevice.llama_backend import LlamaContext, LlamaModel
from ondevice.onnx import export as ex
from ondevice.onnx.decoder import OnnxDecoder
from tiny_models import write_tiny_gguf

CONTEXT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("draftkv") / "tiny.gguf")


@pytest.fixture(scope="module")
def llama_model(tiny_path):
    return LlamaModel(tiny_path)


def llama_cache(model):
    return DraftKV(LlamaContext(model, n_ctx=128, n_seq_max=8, n_batch=32, threads=1))


def onnx_cache(path):
    return OnnxDraftKV(OnnxDecoder(ex.ensure_export(path, accuracy_level=ex.ACCURACY_FP32, show=False), slots=128, threads=1))


@pytest.fixture(params=["llama", "onnx"])
def make_cache(request, tiny_path):
    if request.param == "llama":
        model = request.getfixturevalue("llama_model")
        return lambda: llama_cache(model)
    return lambda: onnx_cache(tiny_path)


def fresh_logits(make_cache, context) -> np.ndarray:
    kv = make_cache()  # alive until its logits are copied (sync returns a view)
    return np.array(kv.sync(context))


def close(a, b) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def grown_tree(kv, context) -> tuple[SearchTree, dict[str, int], dict[int, np.ndarray]]:
    """Expand root → (7, 8), 7 → (9, 2): nodes by name, and each expanded node's logits row."""
    tree = SearchTree(context[-1])
    a, b = tree.add_children(0, np.array([7, 8]), np.array([-0.1, -0.2]))
    rows = dict(zip((a, b), np.array(kv.expand(tree, [a, b]))))
    c, d = tree.add_children(a, np.array([9, 2]), np.array([-0.1, -0.3]))
    rows.update(zip((c, d), np.array(kv.expand(tree, [c, d]))))
    return tree, {"7": a, "8": b, "7-9": c, "7-2": d}, rows


def test_expanded_nodes_see_the_context_and_their_ancestors_only(make_cache):
    kv = make_cache()
    kv.sync(CONTEXT)
    _, node, rows = grown_tree(kv, CONTEXT)
    close(rows[node["8"]], fresh_logits(make_cache, CONTEXT + [8]))
    close(rows[node["7-2"]], fresh_logits(make_cache, CONTEXT + [7, 2]))
    close(rows[node["7-9"]], fresh_logits(make_cache, CONTEXT + [7, 9]))


def test_accepted_nodes_are_kept_not_decoded_again(make_cache):
    kv = make_cache()
    kv.sync(CONTEXT)
    grown_tree(kv, CONTEXT)
    accepted = CONTEXT + [7, 9, 4]  # the path 7 → 9, then the target's bonus token
    logits = np.array(kv.sync(accepted))
    assert kv.tokens == accepted and kv.last_sync_decoded == 1  # only the bonus token
    close(logits, fresh_logits(make_cache, accepted))


def test_a_rolled_back_cache_equals_one_synced_from_scratch(make_cache):
    kv = make_cache()
    kv.sync(CONTEXT)
    grown_tree(kv, CONTEXT)
    other = CONTEXT[:3] + [7, 7]  # leaves the cache at the 4th token and the tree with it
    logits = np.array(kv.sync(other))
    assert kv.tokens == other and kv.last_sync_decoded == 2
    close(logits, fresh_logits(make_cache, other))
    again = np.array(kv.sync(other))  # the same context: only its last token is decoded again
    assert kv.last_sync_decoded == 1
    close(again, logits)


def test_pruned_branches_free_their_room(make_cache):
    kv = make_cache()
    kv.sync(CONTEXT)
    room = kv.free_capacity()
    tree, node, _ = grown_tree(kv, CONTEXT)
    kv.release(tree, {0})  # nothing but the root alive
    assert kv.free_capacity() == room
    accepted = CONTEXT + [7, 9, 4]  # released nodes are not kept: the tokens are decoded again
    logits = np.array(kv.sync(accepted))
    assert kv.last_sync_decoded == 3
    close(logits, fresh_logits(make_cache, accepted))
