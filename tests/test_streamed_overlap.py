"""Drafting while a streamed pass waits for the disk never changes the answer: a target read layer by
layer through the direct-read window from a slow disk, the drafter drafting beside its passes (the
guessed next tree for a chain, the carried best-first search grown for a best-first tree), answers
token for token the target alone's, greedy and sampled (SpecExec: every token a target draw from the
engine's generator)."""

from __future__ import annotations

import sys
import time

import pytest

import tiny_models
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from ondevice.files.gguf_header import OUTPUT_LAYER
from ondevice.decode.protocols import DraftSpec
from ondevice.targets.direct_window import DirectWindow, direct_reads_work
from ondevice.targets.llama_target import LlamaTarget
from ondevice.decode.verify import Sampling

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT, memfd and MAP_FIXED are Linux-only")
PROMPT = [5, 60, 61, 7, 200, 33, 12, 12, 99]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_models.write_layered_gguf(tmp_path_factory.mktemp("streamed-overlap") / "tiny.gguf", 6)
    if not direct_reads_work(path):
        pytest.skip("this file system does not take O_DIRECT reads")
    return path


def decode(engine: SpecEngine, n: int, spec=None, sampling=Sampling()) -> tuple[list[int], object]:
    return collect(engine.generate(PROMPT, n, sampling, spec))


@pytest.mark.parametrize("spec", [DraftSpec("chain", 4), DraftSpec("best-first", 8)], ids=lambda s: f"{s.builder}@{s.budget}")
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafting_beside_a_streamed_pass_keeps_the_target_alones_answer(tiny, monkeypatch, spec, temperature):
    read = DirectWindow._read_piece
    monkeypatch.setattr(DirectWindow, "_read_piece", lambda self, piece: (time.sleep(0.01), read(self, piece))[1])  # a slow disk
    sampling = Sampling(temperature=temperature, seed=7)
    spec = DraftSpec(spec.builder, spec.budget, temperature=temperature, seed=7)
    alone = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64)  # in RAM, no window
    reference, _ = decode(SpecEngine(alone, None, lambda t: False), 24, sampling=sampling)
    alone.close()
    target = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True, window=1, kept_layers=(OUTPUT_LAYER,))
    drafter = LlamaDrafter(tiny, n_ctx=128, threads=1, max_tree=16)  # the same model: its drafts are mostly right
    engine = SpecEngine(target, drafter, lambda t: False, overlap=True)
    out, stats = decode(engine, 24, spec, sampling)
    assert isinstance(target.window, DirectWindow) and target.stream_counters().page_wait_seconds > 0  # it streamed, and waited
    assert stats.prepared_trees > 0  # the drafter worked beside the passes
    assert out == reference
    engine.close()
