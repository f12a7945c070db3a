"""draft/requantized.py: a drafter whose block weights llama.cpp computes a row at a time (Q5_0, Q6_K)
gets a copy in IQ4_NL where llama.cpp repacks IQ4_NL here; the copy keeps the input embeddings' type
(and a head tied to them), a head of its own in IQ4_NL too, is written once and again when its source changes, is what a LlamaDrafter loads
and what the memory plan counts; a drafter of other types is left as it is. Trees from it verified by
the target stay the target's answer (the engine's reference decode)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from ondevice.catalog.stores.derived import is_derived, requantized_paths
from ondevice.decode.engine import SpecEngine
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.stats import collect
from ondevice.decode.verify import Sampling
from ondevice.draft import requantized
from ondevice.machine import repack_layouts
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.draft.requantized import IQ4_NL, drafter_weights, worth_requantizing, write_requantized
from ondevice.files.gguf_header import read_header
from ondevice.loading.footprint import ModelSize
from ondevice.targets.llama_target import LlamaTarget
from ondevice.machine.repack_layouts import repacks_here
from tiny_quant import QUANT_DIMS, encode

pytestmark = pytest.mark.skipif(not repacks_here([(IQ4_NL, (256, 512))])[0],
                                reason="llama.cpp repacks no IQ4_NL weight on this CPU")


def mix(block_type: QT):
    """Block weights in `block_type`, the LM head Q8_0, the input embeddings Q5_0 (as the default drafter's file)."""
    def quantize(name: str, w: np.ndarray):
        qtype = QT.Q8_0 if name == "output.weight" else QT.Q5_0 if name == "token_embd.weight" else block_type
        return encode(w, qtype), qtype
    return quantize


def write_drafter(path, block_type: QT, arch: str = "qwen2"):
    """A tiny drafter: qwen2's head is tied to its input embeddings, qwen3's is a tensor of its own."""
    dims = dict(tiny_models.DIMS)
    tiny_models.DIMS.update(QUANT_DIMS)
    try:
        return tiny_models.write_tiny_gguf(path, arch, quantize=mix(block_type), head_scale=4.0)
    finally:
        tiny_models.DIMS.clear()
        tiny_models.DIMS.update(dims)


@pytest.fixture
def q5_drafter(tmp_path):
    return write_drafter(tmp_path / "drafter.gguf", QT.Q5_0)


def types(path) -> dict[str, str]:
    return {name: t.type_name for name, t in read_header(path).tensors.items()}


def test_a_q5_0_drafter_gets_an_iq4_nl_copy_with_its_head_and_embeddings_kept(q5_drafter):
    assert worth_requantizing(q5_drafter)
    copy = write_requantized(q5_drafter)
    assert copy == requantized_paths(q5_drafter)[0] and is_derived(copy.name)
    before, after = types(q5_drafter), types(copy)
    blocks = [name for name in before if name.startswith("blk.") and before[name] == "Q5_0"]
    assert blocks and all(after[name] == "IQ4_NL" for name in blocks)
    assert {n: t for n, t in after.items() if n not in blocks} == {n: t for n, t in before.items() if n not in blocks}
    assert after["token_embd.weight"] == "Q5_0"  # the input embeddings (and the head, tied to them here) as they were
    assert ModelSize.from_gguf(copy).file_bytes < ModelSize.from_gguf(q5_drafter).file_bytes
    assert drafter_weights(q5_drafter) == copy


def test_a_head_of_its_own_is_requantized_too(tmp_path):
    drafter = write_drafter(tmp_path / "drafter.gguf", QT.Q5_0, arch="qwen3")
    assert types(drafter)["output.weight"] == "Q8_0"
    after = types(write_requantized(drafter))
    assert after["output.weight"] == "IQ4_NL" and after["token_embd.weight"] == "Q5_0"


def test_a_copy_that_kept_its_heads_type_is_written_again(q5_drafter):
    copy, record = requantized_paths(q5_drafter)
    write_requantized(q5_drafter)
    saved = json.loads(record.read_text())
    record.write_text(json.dumps({k: v for k, v in saved.items() if k != "head"}))  # as the copies before
    assert drafter_weights(q5_drafter) == q5_drafter
    assert write_requantized(q5_drafter) == copy and drafter_weights(q5_drafter) == copy


def test_the_copy_is_written_once_and_again_when_its_source_changes(q5_drafter):
    copy = write_requantized(q5_drafter)
    written = copy.stat().st_mtime_ns
    assert write_requantized(q5_drafter) == copy and copy.stat().st_mtime_ns == written
    os.utime(q5_drafter, ns=(written + 10**9, written + 10**9))  # the drafter file replaced
    assert drafter_weights(q5_drafter) == q5_drafter  # a copy of another file is never loaded
    assert write_requantized(q5_drafter) == copy and copy.stat().st_mtime_ns != written
    assert drafter_weights(q5_drafter) == copy


def test_a_half_written_copy_is_never_loaded(q5_drafter):
    copy = write_requantized(q5_drafter)
    with copy.open("r+b") as f:
        f.truncate(copy.stat().st_size // 2)
    assert drafter_weights(q5_drafter) == q5_drafter


@pytest.mark.parametrize("block_type", [QT.Q8_0, QT.Q4_0], ids=["Q8_0", "Q4_0"])
def test_a_drafter_of_other_types_is_left_as_it_is(tmp_path, block_type):
    """Q8_0 was chosen for its precision; Q4_0 is computed in the repacked layouts already."""
    path = write_drafter(tmp_path / "drafter.gguf", block_type)
    assert not worth_requantizing(path)
    assert write_requantized(path) is None and not requantized_paths(path)[0].exists()
    assert drafter_weights(path) == path


def test_where_llama_cpp_does_not_repack_no_copy_is_written_or_loaded(q5_drafter, monkeypatch):
    copy = write_requantized(q5_drafter)
    monkeypatch.setattr(repack_layouts, "repack_buffer_type", lambda: None)  # a CPU without them (no AVX2)
    assert drafter_weights(q5_drafter) == q5_drafter
    copy.unlink()
    assert write_requantized(q5_drafter) is None and not copy.exists()


def test_a_folder_that_refuses_the_write_leaves_the_drafter_as_it_is(q5_drafter, monkeypatch, capsys):
    def refused(weights, out):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(requantized, "quantize", refused)
    assert write_requantized(q5_drafter) is None
    assert drafter_weights(q5_drafter) == q5_drafter and "cannot write" in capsys.readouterr().err
    assert not list(q5_drafter.parent.glob("*.partial"))


def test_the_drafter_loads_the_copy_and_the_answer_stays_the_targets(tmp_path, q5_drafter):
    target_path = tiny_models.write_tiny_gguf(tmp_path / "target.gguf", "qwen2", head_scale=4.0)
    copy = write_requantized(q5_drafter)
    drafter = LlamaDrafter(q5_drafter, n_ctx=128, threads=1)
    target = LlamaTarget(str(target_path), n_ctx=256, threads=1)
    try:
        assert drafter.model.path == copy
        prompt = [5, 17, 42, 9, 11, 23]
        reference, _ = collect(SpecEngine(target, None, lambda t: False).generate(prompt, 24, Sampling(), None))
        answer, stats = collect(SpecEngine(target, drafter, lambda t: False).generate(prompt, 24, Sampling(), DraftSpec("best-first", 8)))
        assert answer == reference and stats.drafted_nodes > 0
    finally:
        drafter.close()
        target.close()


def test_the_memory_plan_counts_the_copy_the_drafter_loads(tmp_path, q5_drafter):
    from ondevice.catalog.hub import PairFiles
    from ondevice.loading.options import LoadOptions
    from ondevice.loading.plan import MemoryPlans

    target = tiny_models.write_tiny_gguf(tmp_path / "target.gguf", "qwen2")
    plans = MemoryPlans(PairFiles("t", "t", target, q5_drafter), LoadOptions(threads=1, ctx=256))
    before = plans.plan("llama", "llama").drafter_bytes
    copy = write_requantized(plans.drafter_file(requantized=False))
    assert plans.drafter_file() == copy and plans.drafter_file(requantized=False) == q5_drafter
    assert plans.plan("llama", "llama").drafter_bytes == ModelSize.from_gguf(copy).file_bytes < before
