"""Models of your own: --target/--drafter, padded vocabularies, the automatic drafter, prompt lookup only.

Tiny GGUFs written here (tests/tiny_models.py). A padded vocabulary is what llama.cpp's converter
writes for Qwen2.5 7B+ (152,064 ids, the extra ones `[PAD…]` of type UNUSED) against the 0.5B's
151,936: here 320 real ids, padded to 384. The reference for generated text is the target alone
(--no-draft, same engine).
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from tiny_models import write_tiny_gguf

from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.errors import OndeviceError
from ondevice.pipeline import load
from ondevice.decode.protocols import DraftSpec
from ondevice.prompt.tokenizer import Tokenizer, check_same_vocab, vocab_mismatch

REAL, PADDED = 320, 384


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("own")
    return {
        "target": write_tiny_gguf(folder / "target.gguf", "qwen2", vocab=REAL, seed=1),
        "target-padded": write_tiny_gguf(folder / "target-padded.gguf", "qwen2", vocab=REAL, seed=1, pad_to=PADDED),
        "drafter": write_tiny_gguf(folder / "drafter.gguf", "qwen2", vocab=REAL, seed=2),
        "drafter-padded": write_tiny_gguf(folder / "drafter-padded.gguf", "qwen2", vocab=REAL, seed=2, pad_to=PADDED),
        "other": write_tiny_gguf(folder / "other.gguf", "qwen2", vocab=REAL - 10, seed=3),  # 10 fewer merges: another tokenizer
        # a separate LM head (Llama): flatter next-token distributions, so a wide tree reaches the padding ids
        "flat-drafter-padded": write_tiny_gguf(folder / "flat-padded.gguf", "llama", vocab=REAL, seed=2, pad_to=PADDED),
    }


def test_padded_vocabulary_is_the_same_tokenizer(tiny):
    target, padded = Tokenizer(tiny["target"]), Tokenizer(tiny["target-padded"])
    assert (target.n_vocab, padded.n_vocab) == (REAL, PADDED)
    assert padded.is_padding(REAL) and not padded.is_padding(REAL - 1)
    assert vocab_mismatch(padded, Tokenizer(tiny["drafter"])) is None  # target longer (Qwen2.5 7B+ / 0.5B)
    assert vocab_mismatch(target, Tokenizer(tiny["drafter-padded"])) is None  # drafter longer
    check_same_vocab(padded, Tokenizer(tiny["drafter"]))


def test_different_tokenizer_is_rejected_in_one_line(tiny):
    with pytest.raises(OndeviceError, match=r"use different tokenizers \(310 vs 320 ids; .*\); pick a drafter of the same model family") as caught:
        check_same_vocab(Tokenizer(tiny["target"]), Tokenizer(tiny["other"]))
    assert "\n" not in str(caught.value)


def test_drafter_with_a_longer_vocabulary_drafts_only_ids_the_target_has(tiny):
    context = Tokenizer(tiny["target"]).encode("hello world, the cat sat on the mat")
    spec = DraftSpec("best-first", budget=64)
    limited = LlamaDrafter(tiny["flat-drafter-padded"], n_ctx=128, threads=1, target_vocab=REAL).draft(context, spec)
    assert len(limited) == 65 and limited.tokens.max() < REAL
    unlimited = LlamaDrafter(tiny["flat-drafter-padded"], n_ctx=128, threads=1).draft(context, spec)
    assert unlimited.tokens.max() >= REAL  # the random padding rows do get drafted without the limit


def test_drafter_stops_when_the_target_commits_an_id_it_lacks(tiny):
    drafter = LlamaDrafter(tiny["drafter"], n_ctx=128, threads=1, target_vocab=PADDED)
    tree = drafter.draft([5, 6, REAL + 3, 7], DraftSpec("chain", budget=4))
    assert len(tree) == 1 and tree.tokens[0] == 7  # no draft: the drafter cannot read id REAL+3


@pytest.mark.parametrize("target, drafter", [("target-padded", "drafter"), ("target", "drafter-padded")])
def test_padded_pair_generates_exactly_the_target_alone(tiny, target, drafter):
    kwargs = dict(target=str(tiny[target]), target_backend="llama", ctx=256, threads=1)
    spec = DraftSpec("best-first", budget=16)
    pipe = load(drafter=str(tiny[drafter]), **kwargs)
    ids = pipe.encode_prompt("the cat sat on")
    drafted = [t for r in pipe.stream_tokens(ids, max_tokens=40, spec=spec) for t in r.token_ids]
    alone = load(draft=False, **kwargs)
    reference = [t for r in alone.stream_tokens(ids, max_tokens=40, spec=None) for t in r.token_ids]
    assert drafted == reference and len(reference) == 40


@pytest.fixture
def no_network(tmp_path, monkeypatch):
    """An empty ONDEVICE_HOME and no source that answers: no catalog drafter can be downloaded."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ONDEVICE_PYPI_INDEX", closed)
    return tmp_path


def test_without_a_compatible_drafter_the_planner_runs_the_free_drafters(tiny, no_network, capsys):
    pipe = load(target=str(tiny["target"]), target_backend="llama", ctx=256, threads=1)
    assert pipe.engine.drafter.model is None and "no compatible drafter found" in capsys.readouterr().err
    prompt = "one two three four five six one two three four five six one two three"
    ids = pipe.encode_prompt(prompt)
    records = list(pipe.stream_tokens(ids, max_tokens=30, spec=DraftSpec("auto", budget=0)))
    rounds = records[-1].stats.rounds_by_config  # planned: the target alone or a free drafter, round by round
    assert pipe.plan is not None and rounds and all(c in ("target", "target+free") or c.split("@")[0] in ("lookup", "suffix", "recycle") for c in rounds)
    alone = load(target=str(tiny["target"]), draft=False, target_backend="llama", ctx=256, threads=1)
    reference = [t for r in alone.stream_tokens(ids, max_tokens=30, spec=None) for t in r.token_ids]
    assert [t for r in records for t in r.token_ids] == reference


def test_automatic_drafter_is_a_downloaded_model_with_the_same_tokenizer(tiny, no_network, capsys):
    models = no_network / "models"
    models.mkdir()
    (models / "drafter.gguf").write_bytes(tiny["drafter"].read_bytes())
    (models / "a-other.gguf").write_bytes(tiny["other"].read_bytes())  # smaller than drafter.gguf: tried first, refused (another tokenizer)
    pipe = load(target=str(tiny["target-padded"]), target_backend="llama", ctx=256, threads=1)
    assert pipe.pair.drafter == models / "drafter.gguf"
    assert "drafter: drafter.gguf (already downloaded, same tokenizer)" in capsys.readouterr().err


def test_bad_references_fail_before_loading(tiny):
    with pytest.raises(OndeviceError, match="--target /nope.gguf: no such file"):
        load(target="/nope.gguf")
    with pytest.raises(OndeviceError, match="is not a Hugging Face reference"):
        load(target="hf:just-a-name")
    with pytest.raises(OndeviceError, match="--drafter and --no-draft contradict"):
        load(target=str(tiny["target"]), drafter=str(tiny["drafter"]), draft=False)


def test_a_drafter_of_another_tokenizer_drafts_across_vocabularies(tiny, capsys):
    pipe = load(target=str(tiny["target"]), drafter=str(tiny["other"]), target_backend="llama", ctx=256, threads=1)
    assert "has another tokenizer (310 vs 320 ids" in capsys.readouterr().err  # tests/test_cross_vocab.py: its answers
    assert pipe.engine.drafter.model.n_vocab == REAL


def test_padding_helper_sees_the_same_ids_as_llama_cpp(tiny):
    padded = Tokenizer(tiny["target-padded"])
    flags = np.array([padded.is_padding(t) for t in range(PADDED)])
    assert flags[:REAL].sum() == 0 and flags[REAL:].all()
