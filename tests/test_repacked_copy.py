"""targets/repacked_copy.py: a streaming target's copy in llama.cpp's repacked layouts. Streamed
through the direct-read window from that copy, a quantized model gives the logits llama.cpp gives
when it repacks the same file in RAM itself; the copy differs from the file only in the weights it
repacks; it is written once, again when its source changes, and not where the disk lacks room."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tiny_models
from ondevice.files.gguf_header import OUTPUT_LAYER, read_header
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.targets import repacked_copy
from ondevice.targets.direct_window import DirectWindow, direct_reads_work
from ondevice.targets.llama_target import LlamaTarget
from ondevice.machine.repack_layouts import layouts_repacked, repacked_names
from ondevice.targets.repacked_copy import RepackedCopy, ensure_copy, write_repacked_copy
from ondevice.decode.tree import DraftTree
from tiny_quant import QUANT_DIMS, q4_k_m_mix

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the direct-read window is Linux-only")


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """A tiny Llama in a Q4_K_M-like mix, four layers of ~3.5 MB (big enough for the window's reads)."""
    dims = dict(tiny_models.DIMS)
    tiny_models.DIMS.update(QUANT_DIMS, num_hidden_layers=4, intermediate_size=8192)
    try:
        path = tiny_models.write_tiny_gguf(tmp_path_factory.mktemp("repack") / "q.gguf", "llama", quantize=q4_k_m_mix, head_scale=4.0)
    finally:
        tiny_models.DIMS.clear()
        tiny_models.DIMS.update(dims)
    with path.open("rb+") as f:
        os.fsync(f.fileno())
    if not repacked_names(path):
        pytest.skip("llama.cpp has no repacked layout for these weights on this CPU")
    return path


def answers(target: LlamaTarget) -> list[np.ndarray]:
    tree = DraftTree(np.array([3, 50, 51, 60]), np.array([-1, 0, 0, 1]), np.zeros(4))
    target.prefill([5, 17, 42, 9, 11, 23, 7, 8, 99])
    out = []
    for path in ([0, 1, 3], [0, 2], [0]):
        out.append(target.forward_tree(tree))
        target.commit(path)
    return out


def test_the_copy_differs_from_the_file_only_in_the_weights_it_repacks(quantized, tmp_path):
    copy = tmp_path / "q.repacked.gguf"
    names = write_repacked_copy(quantized, copy)
    assert copy.stat().st_size == quantized.stat().st_size
    assert any(n.endswith("ffn_up.weight") for n in names) and not any(n.startswith(("token_embd", "output")) for n in names)
    source, written = read_header(quantized), read_header(copy)
    assert source.metadata == written.metadata
    with quantized.open("rb") as a, copy.open("rb") as b:
        for name, t in source.tensors.items():
            assert (written.tensors[name].offset, written.tensors[name].nbytes) == (t.offset, t.nbytes)
            a.seek(t.offset), b.seek(t.offset)
            same = a.read(t.nbytes) == b.read(t.nbytes)
            assert same == (name not in names), name  # repacking moves bytes; the rest is the file's


@pytest.mark.parametrize("window", [1, 0])  # read with direct reads into slots, or left to the page cache
def test_streamed_from_the_copy_it_computes_as_llama_cpp_repacking_in_ram(quantized, tmp_path, window):
    if window and not direct_reads_work(quantized):
        pytest.skip("this file system does not take O_DIRECT reads")
    if not layouts_repacked():
        pytest.skip("llama.cpp has no repacked layouts on this CPU")
    in_ram = LlamaTarget(quantized, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64)  # llama.cpp repacks as it loads
    reference = answers(in_ram)
    in_ram.close()
    copy = tmp_path / "q.repacked.gguf"
    repacked = RepackedCopy(copy, tuple(write_repacked_copy(quantized, copy)))
    target = LlamaTarget(quantized, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True, window=window,
                         kept_layers=(OUTPUT_LAYER, 1) if window else (), repacked=repacked)  # fmt: skip
    assert isinstance(target.window, DirectWindow) == bool(window) and target.model.path == copy and target.model.source == quantized
    for expected, got in zip(reference, answers(target)):
        np.testing.assert_array_equal(got, expected)
    assert not target.marks.pending and len(target.marks.marked) == len(repacked.names)
    assert not target.model.has_vocab and target.n_vocab == Tokenizer(quantized).n_vocab  # streamed without a vocabulary
    target.close()


def test_a_copy_is_written_once_and_again_when_its_source_changes(quantized, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(quantized.read_bytes())
    copy, record = tmp_path / "m.repacked.gguf", tmp_path / "m.repacked.json"
    said = []
    first = ensure_copy(model, copy, record, say=said.append)
    assert first is not None and first.path == copy and len(said) == 1 and "writing" in said[0]
    written = copy.stat().st_mtime_ns
    assert ensure_copy(model, copy, record, say=said.append) == first and len(said) == 1
    assert copy.stat().st_mtime_ns == written
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))  # the source changed
    assert ensure_copy(model, copy, record, say=said.append) == first and len(said) == 2


def test_no_copy_where_the_disk_lacks_room(quantized, tmp_path, monkeypatch):
    class Usage:
        free = quantized.stat().st_size  # less than the copy and the margin after it
    monkeypatch.setattr(repacked_copy.shutil, "disk_usage", lambda _: Usage)
    said = []
    assert ensure_copy(quantized, tmp_path / "c.gguf", tmp_path / "c.json", say=said.append) is None
    assert len(said) == 1 and "no room" in said[0] and not (tmp_path / "c.gguf").exists()
