"""llama_backend: file checks, repacked layouts where they run, quiet logging, decoding and KV-cache operations."""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
import sys
import textwrap
import threading
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from ondevice import llama_backend as lb
from ondevice.machine import llama_repack
from ondevice.errors import OndeviceError
from tiny_models import write_tiny_gguf

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", arch="qwen2")


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter, so a segfault fails a test instead of killing pytest."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)  # the same llama_cpp as this process
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=300
    )


# --- user errors ------------------------------------------------------------------------------


def test_missing_file_is_one_clear_sentence(tmp_path):
    with pytest.raises(OndeviceError, match="does not exist; run `ondevice download`"):
        lb.LlamaModel(tmp_path / "nope.gguf")


def test_file_without_gguf_magic_is_rejected_before_llama_cpp(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"<html>not found</html>" * 10)
    with pytest.raises(OndeviceError, match="not a GGUF model file"):
        lb.load_model(bad)


def test_truncated_gguf_is_an_error_not_a_crash(tiny_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:4000])
    with pytest.raises(OndeviceError, match="not a readable GGUF file"):  # refused before llama.cpp reads it
        lb.LlamaModel(cut)


def test_bad_context_settings_are_errors(tiny_gguf):
    model = lb.LlamaModel(tiny_gguf)
    with pytest.raises(OndeviceError, match="KV cache type"):
        lb.LlamaContext(model, n_ctx=64, kv_type="q4")
    with pytest.raises(OndeviceError, match="sequences per context"):
        lb.LlamaContext(model, n_ctx=64, n_seq_max=lb.LLAMA_MAX_SEQUENCES + 1)


# --- crash guard ------------------------------------------------------------------------------


def test_amx_detection_matches_cpu_flags():
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if any(f.startswith("amx") for f in flags):
        assert llama_repack.cpu_has_amx()


DECODE_EIGHT_TOKENS = """
    import sys, numpy as np
    from ondevice import llama_backend as lb
    model = lb.LlamaModel(sys.argv[1] if len(sys.argv) > 1 else {path!r})
    ctx = lb.LlamaContext(model, n_ctx=256, n_batch=256, threads=2)
    logits = ctx.decode(np.arange(100, 108), np.arange(8), np.zeros(8, np.int32), np.ones(8, bool))
    assert logits.shape == (8, model.n_vocab) and np.isfinite(logits).all()
    print("decoded", logits.shape)
"""


@pytest.mark.real
def test_guarded_load_decodes_a_batch_of_quantized_gguf(real_pair):
    result = run_python(DECODE_EIGHT_TOKENS.format(path=str(real_pair.drafter)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "decoded (8, 151936)" in result.stdout


UNGUARDED = """
    import llama_cpp as L
    L.llama_backend_init()
    mp = L.llama_model_default_params(); mp.use_extra_bufts = True; mp.n_gpu_layers = 0
    m = L.llama_model_load_from_file({path!r}.encode(), mp)
    cp = L.llama_context_default_params(); cp.n_ctx = 256; cp.n_threads = cp.n_threads_batch = 2
    ctx = L.llama_init_from_model(m, cp)
    b = L.llama_batch_init(8, 0, 1); b.n_tokens = 8
    for i in range(8):
        b.token[i] = 100 + i; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = i == 7
    print("rc", L.llama_decode(ctx, b))
"""


@pytest.mark.real
def test_the_repack_verdict_matches_an_unguarded_load(real_pair, tmp_path, monkeypatch):
    """On an AMX CPU the saved verdict (machine/llama_repack.py) says what llama.cpp's own default load
    does with this build: an 8-token batch decodes, or the process dies (a segfault on one Xeon, an
    illegal instruction on another) and every load of ours keeps the AMX kernels off."""
    if not llama_repack.cpu_has_amx():
        pytest.skip("this CPU has no AMX: repacked layouts are always used")
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setenv("ONDEVICE_AMX", "1")  # asked for: the verdict decides
    result = run_python(UNGUARDED.format(path=str(real_pair.drafter)), env={"GGML_NO_BACKTRACE": "1"})
    if llama_repack.repack_runs(real_pair.drafter):
        assert result.returncode == 0 and "rc 0" in result.stdout, result.stderr[-2000:]
    else:
        assert result.returncode in (-signal.SIGSEGV, -signal.SIGILL), f"exit code {result.returncode}: the verdict is wrong"


AMX_AFTER_TORCH = """
    import sys
    import numpy as np
    import torch
    from ondevice import llama_backend as lb

    model = lb.LlamaModel({path!r}, resident=True)
    if not model.tile_kernels:
        sys.exit("no AMX kernels")
    ctx = lb.LlamaContext(model, n_ctx=256, n_seq_max=2, threads=2)

    def nine_tokens():
        logits = np.array(ctx.decode(list(range(100, 109)), list(range(9)), [0] * 9, [True] * 9))
        ctx.seq_rm(0)
        return logits

    before = nine_tokens()
    x = torch.randn(256, 1024, dtype=torch.bfloat16)
    for _ in range(3):
        x @ x.T  # oneDNN's AMX kernels, which release this thread's tile configuration when done
    print("same logits", np.array_equal(before, nine_tokens()))
"""


@pytest.mark.real
def test_amx_passes_survive_torch_amx_work_in_the_same_process(real_pair, tmp_path):
    """torch's bfloat16 matmuls release the calling thread's tile configuration; llama.cpp would trust
    its own, loaded once, and die of an illegal instruction at its next AMX pass on that thread."""
    if not llama_repack.cpu_has_amx():
        pytest.skip("this CPU has no AMX")
    env = {"ONDEVICE_HOME": str(tmp_path), "ONDEVICE_AMX": "1", "GGML_NO_BACKTRACE": "1"}
    result = run_python(AMX_AFTER_TORCH.format(path=str(real_pair.target)), env=env)
    if "no AMX kernels" in result.stderr:
        pytest.skip("this build of llama.cpp does not run its AMX kernels (machine/llama_repack.py)")
    assert result.returncode == 0, f"exit code {result.returncode}: {result.stderr[-2000:]}"
    assert "same logits True" in result.stdout


def test_a_context_on_amx_kernels_decodes_on_a_thread_of_its_own(tiny_gguf, monkeypatch):
    model = lb.LlamaModel(tiny_gguf)
    plain = lb.LlamaContext(model, n_ctx=64, threads=1)
    model.tile_kernels = True  # as on an AMX CPU whose kernels run (the tiny model's f32 weights use none)
    own = lb.LlamaContext(model, n_ctx=64, threads=1)
    threads = []
    decode = llama_cpp.llama_decode
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda *args: threads.append(threading.current_thread().name) or decode(*args))
    tokens = [1, 5, 9, 3]
    expected = np.array(plain.decode(tokens, range(4), [0] * 4, [True] * 4))
    assert np.array_equal(own.decode(tokens, range(4), [0] * 4, [True] * 4), expected)
    assert threads[0] == threading.current_thread().name and threads[1].startswith("llama-amx")
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # what the call raises on its thread reaches the caller
        own.decode(tokens, range(4, 8), [0] * 4, [True] * 4)
    own.close()
    assert own._tile_thread._shutdown


# --- logging ----------------------------------------------------------------------------------


def test_llama_logs_are_silent_by_default_and_can_be_turned_on(tiny_gguf):
    quiet = run_python(DECODE_EIGHT_TOKENS.format(path=str(tiny_gguf)))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.strip() == ""
    loud = run_python(DECODE_EIGHT_TOKENS.format(path=str(tiny_gguf)), env={"ONDEVICE_LLAMA_LOG": "1"})
    assert "llama" in loud.stderr


# --- decoding and the KV cache ----------------------------------------------------------------


def test_logits_are_a_view_of_the_requested_rows(tiny_gguf):
    model = lb.LlamaModel(tiny_gguf)
    ctx = lb.LlamaContext(model, n_ctx=128, n_seq_max=4, n_batch=32, threads=1)
    tokens = np.array([5, 17, 99, 3])
    logits = ctx.decode(tokens, np.arange(4), [0, 0, 0, 0], [False, True, False, True])
    assert logits.shape == (2, model.n_vocab) and logits.dtype == np.float32
    assert not logits.flags.owndata  # no copy of llama.cpp's buffer
    assert ctx.seq_pos_max(0) == 3
    # one-token decode after rolling back reproduces row 3
    row3 = np.array(logits[1])
    ctx.seq_rm(0, 3, -1)
    again = ctx.decode([3], [3], [0], [True])
    np.testing.assert_allclose(again[0], row3, atol=1e-4)


def test_shared_cells_serve_two_sequences(tiny_gguf):
    """A cell tagged with two sequence ids is seen by both; each branch sees only its own tokens."""
    model = lb.LlamaModel(tiny_gguf)
    ctx = lb.LlamaContext(model, n_ctx=128, n_seq_max=4, n_batch=32, threads=1)
    # prefix [7, 8] shared by seqs 1 and 2, then branch 1 gets 40, branch 2 gets 41
    logits = ctx.decode([7, 8, 40, 41], [0, 1, 2, 2], [[1, 2], [1, 2], [1], [2]], [0, 0, 1, 1])
    branches = np.array(logits)
    for row, last in zip(branches, (40, 41)):
        ref = lb.LlamaContext(model, n_ctx=128, n_seq_max=1, n_batch=32, threads=1)
        expected = ref.decode([7, 8, last], [0, 1, 2], [0, 0, 0], [0, 0, 1])[0]
        np.testing.assert_allclose(row, expected, atol=1e-4)
    ctx.seq_cp(1, 3, -1, 2)  # the shared prefix only
    assert ctx.seq_pos_max(3) == 1
    ctx.seq_keep(3)  # drops every other cell, and every other id from the kept cells
    assert ctx.seq_pos_max(3) == 1 and ctx.seq_pos_max(1) == -1 and ctx.seq_pos_max(2) == -1


def test_out_of_range_sequence_ids_raise_instead_of_aborting(tiny_gguf):
    model = lb.LlamaModel(tiny_gguf)
    ctx = lb.LlamaContext(model, n_ctx=64, n_seq_max=2, n_batch=8, threads=1)
    with pytest.raises(ValueError):
        ctx.seq_cp(0, 2)
    with pytest.raises(ValueError):
        ctx.decode([1], [0], [5], [True])


def test_full_context_is_an_ondevice_error(tiny_gguf):
    model = lb.LlamaModel(tiny_gguf)
    ctx = lb.LlamaContext(model, n_ctx=256, n_seq_max=1, n_batch=256, threads=1)
    ctx.decode(np.arange(200), np.arange(200), np.zeros(200, np.int32), np.zeros(200, bool))
    with pytest.raises(OndeviceError, match="is full"):
        ctx.decode(np.arange(100), 200 + np.arange(100), np.zeros(100, np.int32), np.zeros(100, bool))


def test_a_tokenizer_reading_a_loaded_models_vocabulary_tokenizes_as_its_own_copy(tiny_gguf, tmp_path):
    """The pipeline's tokenizer reads the llama.cpp target's vocabulary (one copy in RAM, not two):
    it must tokenize exactly as a vocab-only load of the same file, and keep the model loaded until
    it is closed too, whichever closes first."""
    from ondevice.prompt.tokenizer import Tokenizer

    own, shared = Tokenizer(tiny_gguf), Tokenizer(tiny_gguf)
    model = lb.LlamaModel(tiny_gguf)
    shared.read_from(model)
    assert shared.reads_from is model and own.reads_from is None

    def same() -> None:
        text = "the quick brown fox jumps over 12 lazy dogs <|im_end|>\n"
        assert shared.encode(text) == own.encode(text) and shared.encode(text, add_special=True) == own.encode(text, add_special=True)
        assert shared.special_ids() == own.special_ids() and shared.n_vocab == own.n_vocab
        for t in range(own.n_vocab):
            assert (shared.text(t), shared.attr(t), shared.piece(t, special=True), shared.is_end(t)) == \
                   (own.text(t), own.attr(t), own.piece(t, special=True), own.is_end(t))

    same()
    model.close()  # the target closes first (Pipeline.close): the tokenizer still reads it
    assert model.handle is not None
    same()
    shared.close()
    assert model.handle is None  # freed with its last reader
    shared.close()  # twice is fine

    other = write_tiny_gguf(tmp_path / "other.gguf", arch="qwen2")
    with pytest.raises(ValueError, match="not"):
        own.read_from(lb.LlamaModel(other))
    own.close()


def test_a_tokenizer_that_let_go_of_its_vocabulary_answers_as_one_that_kept_it(tiny_gguf):
    """Where the target streams, the tokenizer frees llama.cpp's copy of the vocabulary and keeps what
    decoding reads (Tokenizer.let_go); every answer must stay the kept copy's."""
    from ondevice.prompt.tokenizer import Tokenizer

    kept, lean = Tokenizer(tiny_gguf), Tokenizer(tiny_gguf)
    lean.let_go()
    assert lean.lets_go and not kept.lets_go
    text = "the quick brown fox jumps over 12 lazy dogs <|im_end|>\n"
    assert lean.encode(text) == kept.encode(text) and lean.encode(text, add_special=True) == kept.encode(text, add_special=True)
    assert lean.special_ids() == kept.special_ids() and lean.end_ids() == kept.end_ids() and lean.fingerprint() == kept.fingerprint()
    for t in range(kept.n_vocab):
        assert (lean.piece(t), lean.piece(t, special=True), lean.is_end(t)) == (kept.piece(t), kept.piece(t, special=True), kept.is_end(t))
    ids = kept.encode(text)
    assert lean.decode(ids) == kept.decode(ids)
    with lean.held():  # one load for many encodes, let go of again after the block
        assert [lean.encode(w) for w in text.split()] == [kept.encode(w) for w in text.split()]
    assert lean.lets_go
    with ThreadPoolExecutor(4) as pool:  # a server's requests encode in threads of their own
        assert list(pool.map(lean.encode, [text] * 16)) == [kept.encode(text)] * 16
    model = lb.LlamaModel(tiny_gguf)
    lean.read_from(model)  # a target that turned out to be in RAM: its vocabulary read again
    assert not lean.lets_go and lean.reads_from is model and lean.encode(text) == kept.encode(text)
    lean.close()
    kept.close()


def test_a_model_loaded_without_its_vocabulary_computes_the_same_logits(tiny_gguf):
    """A target streaming from disk and every drafter load without llama.cpp's tokenizer (the
    tokenizer holds it apart): the same vocabulary size, the same logits."""
    logits = []
    for vocab in (True, False):
        model = lb.LlamaModel(tiny_gguf, vocab=vocab)
        ctx = lb.LlamaContext(model, n_ctx=64, n_seq_max=1, n_batch=64, threads=1)
        logits.append((model.n_vocab, ctx.decode(np.arange(20), np.arange(20), np.zeros(20, np.int32), np.ones(20, bool)).copy()))
        assert model.has_vocab == vocab
        ctx.close()
        model.close()
    assert logits[0][0] == logits[1][0]
    np.testing.assert_array_equal(logits[0][1], logits[1][1])
