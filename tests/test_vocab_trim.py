"""VocabTrim: the trimmed drafter is the same drafter, restricted to the kept tokens.

Real-model tests (marked `real`, skipped when the 0.5B drafter is not downloaded) check against
llama.cpp running the untouched drafter: the trimmed GGUF loads with n_vocab == K and, fed the
original embeddings, gives logits equal to the full model's at keep_ids. Tolerance: none (exact
equality) — each logit is the same dot product over the same quantized row and hidden state, and
bit-identical logits were observed (DESIGN.md). A small synthetic GGUF checks the writer's
vocabulary surgery (merges, scores, special ids) without any model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest

from ondevice.vocabtrim.head import TrimmedContext, TrimmedHead
from ondevice.errors import OndeviceError
from ondevice.llama_backend import LlamaContext, LlamaModel
from ondevice.bench.prompt_sets import CALIBRATION
from ondevice.vocabtrim import build as vt
from ondevice.prompt.tokenizer import Tokenizer

K = 4096  # small: fast to write, and most ids of any text fall outside it (inputs must still work)


# ---------------------------------------------------------------------------------------------
# Fixtures: the real drafter, and one trimmed copy of it per session


@pytest.fixture(scope="session")
def real_drafter(real_pair) -> Path:
    return Path(real_pair.drafter)  # downloaded on first use (conftest), never skipped


@pytest.fixture(scope="session")
def drafter_reader(real_drafter) -> gguf.GGUFReader:
    return gguf.GGUFReader(real_drafter)  # ~10 s: gguf parses the whole vocabulary


@pytest.fixture(scope="session")
def trimmed_drafter(tmp_path_factory, real_drafter, drafter_reader) -> Path:
    """A link to the real drafter in a temp dir, with a K-token trimmed copy built beside it."""
    drafter = tmp_path_factory.mktemp("models") / real_drafter.name
    drafter.symlink_to(real_drafter)
    tokenizer = Tokenizer(real_drafter)
    counts = np.bincount(tokenizer.encode(" ".join(CALIBRATION)), minlength=tokenizer.n_vocab)
    keep_ids = vt.top_k_tokens(counts, K, vt.always_kept_ids(drafter_reader))
    vt.build_trimmed(drafter, keep_ids, "test: token counts of the calibration prompts", reader=drafter_reader)
    return drafter


# ---------------------------------------------------------------------------------------------
# The trimmed GGUF in llama.cpp


@pytest.mark.real
def test_trimmed_gguf_loads_with_k_tokens(trimmed_drafter, real_drafter):
    head = TrimmedHead(trimmed_drafter)
    full, trimmed = LlamaModel(real_drafter), LlamaModel(head.gguf_path)
    assert trimmed.n_vocab == head.n_vocab == K
    full_vocab, trimmed_vocab = (llama_cpp.llama_model_get_vocab(m.handle) for m in (full, trimmed))
    for new_id in (0, 1000, K - 1):  # token texts follow keep_ids
        old_id = int(head.keep_ids[new_id])
        assert llama_cpp.llama_vocab_get_text(trimmed_vocab, new_id) == llama_cpp.llama_vocab_get_text(full_vocab, old_id)
    for special in (llama_cpp.llama_vocab_eos, llama_cpp.llama_vocab_bos):  # special ids renumbered
        assert head.keep_ids[special(trimmed_vocab)] == special(full_vocab)


@pytest.mark.real
def test_trimmed_logits_equal_full_logits_at_keep_ids(trimmed_drafter, real_drafter):
    """Same batch schedule (a prompt, three single steps, a batch of five) through both models."""
    head = TrimmedHead(trimmed_drafter)
    tokenizer = Tokenizer(real_drafter)
    prompt = tokenizer.encode("def fibonacci(n):\n    # return the n-th Fibonacci number\n")
    steps = [[tokenizer.eos_id], [151644], [K + 17], [9, 120000, 42, 151645, 7]]  # specials, ids outside keep
    schedule = [prompt] + steps
    assert any(t not in set(head.keep_ids) for t in prompt), "inputs must include ids the trimmed vocab lacks"

    full_ctx = LlamaContext(LlamaModel(real_drafter), n_ctx=512, n_seq_max=1, n_batch=64, threads=1)
    trimmed_ctx = TrimmedContext(
        LlamaContext(LlamaModel(head.gguf_path), n_ctx=512, n_seq_max=1, n_batch=64, threads=1, embeddings_input=True), head
    )
    full_rows, trimmed_rows, raw_rows = [], [], []
    pos = 0
    for tokens in schedule:
        positions, seqs, outputs = pos + np.arange(len(tokens)), np.zeros(len(tokens), np.int32), np.ones(len(tokens), bool)
        full_rows.append(np.array(full_ctx.decode(tokens, positions, seqs, outputs)))
        trimmed_rows.append(np.array(trimmed_ctx.decode(tokens, positions, seqs, outputs)))
        raw_rows.append(np.array(trimmed_ctx.ctx.logits(len(tokens))))  # (n, K) as llama.cpp returned them
        pos += len(tokens)
    full, trimmed, raw = (np.concatenate(rows) for rows in (full_rows, trimmed_rows, raw_rows))

    assert raw.shape == (len(full), K)
    np.testing.assert_array_equal(raw, full[:, head.keep_ids])  # exact: see the module docstring
    np.testing.assert_array_equal(trimmed, raw)  # the K columns, token keep_ids[i] in column i
    outside = np.ones(head.n_vocab_full, bool)
    outside[head.keep_ids] = False
    masked_full = np.where(outside, -np.inf, full)
    np.testing.assert_array_equal(head.to_target_ids(trimmed.argmax(1)), masked_full.argmax(1))


@pytest.mark.real
def test_embed_is_the_drafter_token_embd(trimmed_drafter, drafter_reader):
    head = TrimmedHead(trimmed_drafter)
    embd = next(t for t in drafter_reader.tensors if t.name == "token_embd.weight")
    ids = [0, 5, 151645, 151935]
    expected = gguf.quants.dequantize(embd.data[ids], embd.tensor_type)
    np.testing.assert_array_equal(head.embed(ids), expected)
    assert head.embed(ids).shape == (4, head.n_embd) and head.embed([]).shape == (0, head.n_embd)


# ---------------------------------------------------------------------------------------------
# Choosing the kept set


@pytest.mark.real
def test_always_kept_ids_cover_specials_and_every_byte(real_drafter, drafter_reader):
    always = vt.always_kept_ids(drafter_reader)
    tokenizer = Tokenizer(real_drafter)
    end_of_turn = tokenizer.encode("<|im_end|>", parse_special=True)
    assert tokenizer.eos_id in always and tokenizer.bos_id in always and set(end_of_turn) <= set(always)
    single_bytes = {tokenizer.piece(int(t)) for t in always if len(tokenizer.piece(int(t))) == 1}
    assert single_bytes == {bytes([b]) for b in range(256)}  # llama.cpp decodes them to all 256 bytes
    assert len(always) < 300


def test_top_k_tokens_ranks_by_frequency_and_keeps_required_ids():
    counts = np.array([0, 5, 9, 5, 0, 1, 0, 0])
    assert list(vt.top_k_tokens(counts, 3)) == [1, 2, 3]  # 9, then the tie 5/5
    assert list(vt.top_k_tokens(counts, 4, always_keep=[7])) == [1, 2, 3, 7]
    assert list(vt.top_k_tokens(counts, 5, always_keep=[7])) == [1, 2, 3, 5, 7]
    assert list(vt.top_k_tokens(counts, 6, always_keep=[7])) == [0, 1, 2, 3, 5, 7]  # zero counts: lower ids first
    assert len(vt.top_k_tokens(counts, 8)) == 8
    with pytest.raises(OndeviceError):
        vt.top_k_tokens(counts, 1, always_keep=[6, 7])
    with pytest.raises(OndeviceError):
        vt.top_k_tokens(counts, 9)


# ---------------------------------------------------------------------------------------------
# Finding the trimmed drafter again


@pytest.mark.real
def test_find_trimmed_refuses_a_trimmed_drafter_built_for_another_drafter(trimmed_drafter, tmp_path):
    trimmed, record = vt.trimmed_paths(trimmed_drafter)
    assert vt.find_trimmed(trimmed_drafter) == trimmed
    assert vt.find_trimmed(tmp_path / "no-trim.gguf") is None

    same_size = tmp_path / "same-size.gguf"  # another file of the drafter's size: caught by sha256
    with same_size.open("wb") as f:
        f.truncate(trimmed_drafter.stat().st_size)
    smaller = tmp_path / "smaller.gguf"  # caught by size
    smaller.write_bytes(b"GGUF")
    for other in (same_size, smaller):
        other_trimmed, other_record = vt.trimmed_paths(other)
        other_trimmed.symlink_to(trimmed)
        shutil.copy(record, other_record)
        with pytest.raises(OndeviceError, match="built from another drafter"):
            vt.find_trimmed(other)
        with pytest.raises(OndeviceError, match="built from another drafter"):
            TrimmedHead.find(other)


# ---------------------------------------------------------------------------------------------
# The writer on a tiny synthetic GGUF (no model needed)


def _tiny_gguf(path: Path) -> None:
    """6 tokens, 4 merges, scores, Q8_0 output rows (32 wide), a bos and an eos."""
    tokens = ["a", "b", "ab", "c", "abc", "<eos>"]
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1, 1, 1, 1, 1, 3])
    writer.add_token_scores([0.0, -1.0, -2.0, -3.0, -4.0, 0.0])
    writer.add_token_merges(["a b", "ab c", "b c", "a bc"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(5)
    rows = np.arange(6 * 32, dtype=np.float32).reshape(6, 32)
    writer.add_tensor("output.weight", gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", rows)
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_write_trimmed_gguf_keeps_rows_vocab_and_whole_merges(tmp_path):
    src, dst = tmp_path / "tiny.gguf", tmp_path / "tiny-trim.gguf"
    _tiny_gguf(src)
    write_keep = np.array([0, 1, 2, 5])  # drops "c" and "abc"
    vt.write_trimmed_gguf(src, dst, write_keep)
    old, new = gguf.GGUFReader(src), gguf.GGUFReader(dst)
    assert new.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "ab", "<eos>"]
    assert new.fields["tokenizer.ggml.token_type"].contents() == [1, 1, 1, 3]
    assert new.fields["tokenizer.ggml.scores"].contents() == [0.0, -1.0, -2.0, 0.0]
    assert new.fields["tokenizer.ggml.merges"].contents() == ["a b"]
    assert new.fields["tokenizer.ggml.eos_token_id"].contents() == 3
    assert new.fields["tokenizer.ggml.bos_token_id"].contents() == 0
    old_tensors, new_tensors = ({t.name: t for t in r.tensors} for r in (old, new))
    for name in ("output.weight", "token_embd.weight"):
        assert np.array_equal(new_tensors[name].data, old_tensors[name].data[write_keep])  # quantized bytes untouched
        assert new_tensors[name].tensor_type == old_tensors[name].tensor_type
    assert np.array_equal(new_tensors["output_norm.weight"].data, old_tensors["output_norm.weight"].data)
    with pytest.raises(ValueError):
        vt.write_trimmed_gguf(src, tmp_path / "bad.gguf", np.array([0, 1, 2]))  # eos not kept


@pytest.mark.real
def test_cli_builds_a_trimmed_drafter_that_is_found(tmp_path, monkeypatch, real_pair, real_drafter):
    """`ondevice quant vocab-trim` end to end on one short calibration prompt, in a temp home."""
    from typer.testing import CliRunner

    from ondevice.cli.quant_cmd import app

    target = Path(real_pair.target)
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    models = tmp_path / "models"
    models.mkdir()
    for path in (target, real_drafter):  # hard links share the inode (and mtime), so the hub's
        _link(path, models / path.name)  # .verified markers stay valid and nothing is rehashed
        marker = path.with_name(path.name + ".verified")
        if marker.exists():
            shutil.copy(marker, models / marker.name)
    args = ["vocab-trim", "--k", str(K), "--prompts", "1", "--eval", "1", "--max-tokens", "8", "--threads", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"kept      {K:,} of 151,936 tokens" in result.output
    assert f"held-out  K={K:<6,} covers" in result.output and "ms trimmed" in result.output
    head = TrimmedHead.find(models / real_drafter.name)
    assert head is not None and head.n_vocab == K


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        dst.symlink_to(src)
