"""Malformed GGUF files: one line naming what is wrong, never a traceback, abort, hang or unbounded
memory — and llama.cpp never sees a file it would abort on.

Named regression tests: each case found so far as the CLI meets it (`ondevice profile --target F`,
`generate`, `bench`), and for the well-formed files llama.cpp aborts on, proof that llama.cpp alone
does abort (tests/llama_alone_child.py). The fuzz tests: seeded mutants of three tiny models —
the format broken (tests/gguf_mutants.py) and well-formed metadata llama.cpp asserts on
(tests/gguf_model_mutants.py) — opened as ondevice opens a model — header, memory plan, gguf-py,
llama.cpp vocabulary, model, tokenizing every byte, one decode — in a child process
(tests/gguf_fuzz_child.py) watched for crashes, hangs and memory.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import gguf
import pytest

from gguf_model_mutants import ARRAY, FLOAT32, INT32, STRING, UINT32, read_gguf, write_gguf
from gguf_mutants import header_fields, patch_field
from ondevice.errors import OndeviceError
from ondevice.files.gguf_check import check_model_file
from ondevice.files.gguf_header import read_header
from ondevice.prompt.tokenizer import Tokenizer
from test_cli import assert_one_line_error
from tiny_models import CHATML, tiny_vocab, write_tiny_gguf

TESTS = Path(__file__).parent
FUZZ_CASES = 200  # per base model: 600 in all, ~5 s
MODEL_FUZZ_CASES = 180  # well-formed mutants per base model: 540 in all, ~5 s
CASE_SECONDS = 20  # a case that takes longer is a hang
MAX_RSS_BYTES = 1 << 30


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> bytes:
    """A valid tiny Llama GGUF with a chat template and an explicit general.alignment."""
    path = tmp_path_factory.mktemp("base") / "base.gguf"
    write_tiny_gguf(path, arch="llama", chat_template=CHATML, alignment=32)
    return path.read_bytes()


def one_line_error(args: list[str]) -> str:
    """Run the CLI; assert it failed with one `error:` line (exit 1: not -6, SIGABRT); that line."""
    result = subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, timeout=120)
    assert_one_line_error(result)
    return result.stderr.strip()


def raw_gguf(kv: bytes, n_kv: int) -> bytes:
    """A header with these raw key/value bytes and no tensors."""
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + kv


def kv_bytes(key: str, kind: int, value: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value


def nested_arrays(depth: int) -> bytes:
    """general.x = [[[…[1]…]]] nested `depth` deep."""
    return raw_gguf(kv_bytes("general.x", 9, struct.pack("<IQ", 9, 1) * (depth - 1) + struct.pack("<IQI", 4, 1, 1)), 1)


# (name, how to make the file from the base, words the one error line must hold)
MALFORMED_FILES = [
    ("key-length-2^40", lambda b: patch_field(b, "key 0 length", 1 << 40), "length of a metadata key"),
    ("n_kv-2^63", lambda b: patch_field(b, "n_kv", 1 << 63), "number of metadata keys"),
    ("string-length-2^63", lambda b: patch_field(b, "kv general.architecture string length", 1 << 63), "length of"),
    ("n_tensors-2^63", lambda b: patch_field(b, "n_tensors", 1 << 63), "number of tensors"),
    ("20000-nested-arrays", lambda b: nested_arrays(20_000), "array of value type 9"),
    ("alignment-0", lambda b: patch_field(b, "kv general.alignment value", 0), "general.alignment"),
    ("alignment-array", lambda b: raw_gguf(kv_bytes("general.alignment", 9, struct.pack("<IQI", 4, 1, 32)), 1), "general.alignment"),
    ("tensor-offset-1e12", lambda b: patch_field(b, "tensor 0 offset", 10**12), "offset 1,000,000,000,000"),
    ("dim-2^63+1", lambda b: patch_field(b, "tensor 0 dim 0", (1 << 63) + 1), "shape"),
    ("dim-negative", lambda b: patch_field(b, "tensor 0 dim 1", (1 << 64) - 1), "shape"),
    ("block_count-2^31-1", lambda b: patch_field(b, "kv llama.block_count value", (1 << 31) - 1), "1..512 layers"),
]


@pytest.mark.parametrize("name,make,words", MALFORMED_FILES, ids=[c[0] for c in MALFORMED_FILES])
def test_each_malformed_file_is_refused_in_one_line(base, tmp_path, name, make, words):
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(make(base))
    line = one_line_error(["profile", "--target", str(path), "--threads", "1"])
    assert str(path) in line and words in line, line



# --- found by the fuzz test, or what llama.cpp asserts on: refused before llama.cpp sees the file ---


def with_kv(data: bytes, key: str, kind: int, value: bytes) -> bytes:
    """`data` with one more key/value, padded by a second one so the tensor data keeps its alignment."""
    end_of_kv = next(f.offset for f in header_fields(data)[0] if f.label == "tensor 0 name length")
    added = kv_bytes(key, kind, value)
    pad = -(len(added) + len(kv_bytes("general.pad", 8, struct.pack("<Q", 0)))) % 32
    added += kv_bytes("general.pad", 8, struct.pack("<Q", pad) + b" " * pad)
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    return data[:16] + struct.pack("<Q", n_kv + 2) + data[24:end_of_kv] + added + data[end_of_kv:]


def string_value(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def tensor_type(name: str, kind: int):
    """A mutation: the tensor called `name` gets the GGML type `kind`."""
    return lambda data: patch_field(data, f"tensor {header_fields(data)[2].index(name)} type", kind)


def duplicate_token(data: bytes) -> bytes:
    """Token 1 spelled as token 0 (both 2 bytes long)."""
    fields = {f.label: f.offset for f in header_fields(data)[0]}
    first, second = fields["kv tokenizer.ggml.tokens item 0 length"] + 8, fields["kv tokenizer.ggml.tokens item 1 length"] + 8
    return data[:second] + data[first : first + 2] + data[second + 2 :]


FOUND_CASES = [
    ("vector-in-f16", tensor_type("rope_freqs.weight", 1), "not F32"),
    ("matrix-of-int32", tensor_type("output.weight", 26), "not a weight type"),
    ("duplicate-token-text", duplicate_token, "twice"),
    ("head_count-a-float", lambda b: patch_field(b, "kv llama.attention.head_count type", 6), "llama.attention.head_count"),
    ("token_type-unsigned", lambda b: patch_field(b, "kv tokenizer.ggml.token_type element type", 4), "tokenizer.ggml.token_type"),
    ("rope-scaling-unknown", lambda b: with_kv(b, "llama.rope.scaling.type", 8, string_value("bogus")), "rope.scaling.type"),
    ("expert_count-5000", lambda b: with_kv(b, "llama.expert_count", 4, struct.pack("<I", 5000)), "expert_count"),
    ("experts-used-without-experts", lambda b: with_kv(b, "llama.expert_used_count", 4, struct.pack("<I", 2)), "without experts"),
]


@pytest.mark.parametrize("name,make,words", FOUND_CASES, ids=[c[0] for c in FOUND_CASES])
def test_metadata_llama_cpp_would_abort_on_is_refused(base, tmp_path, name, make, words):
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(make(base))
    read_header(path)  # a well-formed header: what is wrong is what llama.cpp would do with it
    with pytest.raises(OndeviceError, match=words.replace(".", r"\.")) as caught:
        check_model_file(path)
    assert "\n" not in str(caught.value)
    with pytest.raises(OndeviceError):
        Tokenizer(path)  # the vocabulary load, first in every pipeline, goes through the check


# --- well-formed files llama.cpp aborts on (or hangs): proof that it does, and ondevice's one line ---


def remodel(data: bytes, change, alignment: int = 32) -> bytes:
    model = read_gguf(data)
    change(model)
    return write_gguf(model, alignment)


def tokenizer_model(name: str, merges: bool = True, scores: bool = False, byte_token: int | None = None):
    def change(model):
        model.kv["tokenizer.ggml.model"] = (STRING, name.encode())
        n = len(model.kv["tokenizer.ggml.tokens"][1][1])
        if not merges:
            model.kv.pop("tokenizer.ggml.merges")
        if scores:
            model.kv["tokenizer.ggml.scores"] = (ARRAY, (FLOAT32, [0.0] * n))
        if byte_token is not None:
            types = list(model.kv["tokenizer.ggml.token_type"][1][1])
            types[byte_token] = 6  # BYTE
            model.kv["tokenizer.ggml.token_type"] = (ARRAY, (INT32, types))
    return change


def nul_in_token(model):
    tokens = list(model.kv["tokenizer.ggml.tokens"][1][1])
    tokens[300] = tokens[300][:1] + b"\0" + tokens[300][1:]
    model.kv["tokenizer.ggml.tokens"] = (ARRAY, (STRING, tokens))


def rms_epsilon(value: float):
    def change(model):
        model.kv["llama.attention.layer_norm_rms_epsilon"] = (FLOAT32, value)
    return change


def packed_at_one_byte(model):
    model.kv["general.alignment"] = (UINT32, 1)
    model.kv["general.padding"] = (STRING, b"x")  # so the data section does not happen to fall on 32 bytes


# (name, the file from the base, words the one error line must hold, what llama.cpp alone does with it)
DEADLY_CASES = [
    ("tokenizer-llama-without-merges", lambda b: remodel(b, tokenizer_model("llama", merges=False)), "byte token", "aborted"),
    ("tokenizer-llama-with-scores", lambda b: remodel(b, tokenizer_model("llama", merges=False, scores=True)), "byte token", "aborted"),
    ("bert-with-a-byte-token", lambda b: remodel(b, tokenizer_model("bert", merges=False, byte_token=65)), "'bert'", "aborted"),
    ("nul-in-a-token-text", lambda b: remodel(b, nul_in_token), "NUL byte", "aborted"),
    ("rms-epsilon-minus-1", lambda b: remodel(b, rms_epsilon(-1.0)), "layer_norm_rms_epsilon is -1.0", "aborted"),
    ("rms-epsilon-nan", lambda b: remodel(b, rms_epsilon(float("nan"))), "layer_norm_rms_epsilon is nan", "aborted"),
    ("alignment-1-packed", lambda b: remodel(b, packed_at_one_byte, alignment=1), "not a multiple of 32", "aborted"),
    ("tokenizer-rwkv", lambda b: remodel(b, tokenizer_model("rwkv")), "'rwkv'", "hung"),
]


def llama_cpp_alone(path: Path, seconds: float = 20) -> str:
    """What llama.cpp does with the file without ondevice's checks: "aborted", "hung", "refused" or "loaded"."""
    try:
        result = subprocess.run([sys.executable, str(TESTS / "llama_alone_child.py"), str(path)], capture_output=True, text=True,
                                timeout=seconds, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    except subprocess.TimeoutExpired:
        return "hung"
    return "aborted" if result.returncode < 0 else result.stdout.strip() or f"exit {result.returncode}"


@pytest.mark.parametrize("name,make,words,alone", DEADLY_CASES, ids=[c[0] for c in DEADLY_CASES])
def test_well_formed_file_llama_cpp_dies_on_is_one_line(base, tmp_path, name, make, words, alone):
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(make(base))
    read_header(path)  # valid GGUF: nothing for the header reader to refuse
    assert llama_cpp_alone(path, seconds=4 if alone == "hung" else 30) == alone  # the case is real with this llama.cpp
    line = one_line_error(["generate", "hi", "--target", str(path), "--no-draft", "--threads", "1"])
    assert str(path) in line and words in line, line


def test_bench_refuses_a_file_llama_cpp_dies_on_in_one_line(base, tmp_path):
    path = tmp_path / "nul.gguf"
    path.write_bytes(remodel(base, nul_in_token))
    line = one_line_error(["bench", "--target", str(path), "--no-draft", "--threads", "1", "--limit", "1", "--max-tokens", "4"])
    assert "NUL byte" in line, line


def test_split_name_of_zero_parts_is_one_line(base, tmp_path):
    """A valid file named as part 1 of 0 (an IndexError in the header reader before)."""
    path = tmp_path / "m-00001-of-00000.gguf"
    path.write_bytes(base)
    line = one_line_error(["generate", "hi", "--target", str(path), "--no-draft", "--threads", "1"])
    assert "m-00001-of-00000.gguf" in line and "parts" in line, line


def test_the_rewritten_base_and_a_sentencepiece_vocabulary_load(base, tmp_path):
    """The rewriter makes valid files unless told otherwise: the base rewritten is the same bytes, and
    a SentencePiece vocabulary with all 256 byte tokens passes the check and runs in llama.cpp."""
    from gguf_model_mutants import as_sentencepiece

    assert remodel(base, lambda model: None) == base
    path = tmp_path / "spm.gguf"
    path.write_bytes(remodel(base, as_sentencepiece))
    check_model_file(path)
    assert llama_cpp_alone(path) == "loaded"
    tokenizer = Tokenizer(path)
    assert tokenizer.decode(tokenizer.encode("hello\n\0\xff")).endswith("hello\n\0\xff")  # SentencePiece adds a leading space


def test_the_base_and_an_added_key_load(base, tmp_path):
    """The helpers above make valid files unless told otherwise: the base with an added harmless key loads."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(with_kv(base, "general.comment", 8, string_value("fine")))
    assert check_model_file(path).metadata["general.comment"] == "fine"
    assert Tokenizer(path).encode("hello")


def test_vocabulary_only_file_as_a_target_is_one_line(tmp_path):
    tokens, types, merges = tiny_vocab(320)
    writer = gguf.GGUFWriter(str(tmp_path / "vocab.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "holds no weights" in one_line_error(["generate", "hi", "--target", str(tmp_path / "vocab.gguf"), "--no-draft"])


def test_model_without_an_embedding_table_is_one_line(base, tmp_path):
    """Found by the fuzz test: the memory plan needs token_embd.weight (a KeyError before)."""
    path = tmp_path / "renamed.gguf"
    path.write_bytes(base.replace(b"token_embd.weight", b"token_embe.weight"))
    assert "token_embd.weight" in one_line_error(["generate", "hi", "--target", str(path), "--no-draft"])


def test_chat_template_that_is_not_utf8_still_loads(base, tmp_path):
    start = base.index(b"{% for m in messages %}")
    path = tmp_path / "latin1.gguf"
    path.write_bytes(base[:start] + b"\xff" + base[start + 1 :])
    assert Tokenizer(path).chat_template.startswith("\ufffd")


# --- the fuzz test ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_bases(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("fuzz")
    return [write_tiny_gguf(folder / "llama.gguf", arch="llama", chat_template=CHATML, alignment=32),
            write_tiny_gguf(folder / "qwen2.gguf", arch="qwen2", chat_template=CHATML, dtype="f16"),
            write_tiny_gguf(folder / "qwen3.gguf", arch="qwen3", chat_template=CHATML)]


def run_fuzz(base: Path, seed: int, n: int, kind: str = "header") -> tuple[list[dict], list[str]]:
    """Every mutant's outcome, and the problems: a crash, a hang, a traceback, memory past the bound.
    A child that dies or stalls on a case is restarted past it."""
    results, problems, start = [], [], 0
    while start < n:
        child = subprocess.Popen([sys.executable, str(TESTS / "gguf_fuzz_child.py"), str(base), str(seed), str(n), str(start), kind],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GGML_NO_BACKTRACE": "1"})
        current, start = None, n
        while True:
            ready, _, _ = select.select([child.stdout], [], [], CASE_SECONDS)
            line = child.stdout.readline() if ready else None
            if line is None or line == "":
                if line is None:
                    problems.append(f"{base.name} seed {seed} case {current}: no answer in {CASE_SECONDS} s (hang)")
                    child.kill()
                child.wait()
                if current is not None and not any(r["i"] == current for r in results):
                    if line == "":
                        problems.append(f"{base.name} seed {seed} case {current}: the process died ({child.returncode})")
                    start = current + 1
                break
            if line.startswith("start "):
                current = int(line.split()[1])
                continue
            if not line.startswith("{"):  # what a dying llama.cpp writes (its backtrace)
                continue
            record = json.loads(line)
            if record.get("done"):
                if record["maxrss_kb"] * 1024 > MAX_RSS_BYTES:
                    problems.append(f"{base.name} seed {seed}: peak memory {record['maxrss_kb'] // 1024} MB")
                continue
            results.append(record)
            if record["outcome"].startswith("bug"):
                problems.append(f"{base.name} seed {seed} {record['label']}: {record['outcome'][-800:]}")
    return results, problems


def test_fuzzed_gguf_metadata_never_aborts_hangs_or_traces(fuzz_bases):
    """Seeded well-formed mutants of what llama.cpp asserts on (tokenizer model, token types, NUL in
    token texts, norm epsilons, alignment; ONDEVICE_FUZZ_SEED picks another seed): each ends in one
    line or loads, tokenizes every byte and decodes; and the fuzz is not vacuous (both outcomes occur)."""
    seed = int(os.environ.get("ONDEVICE_FUZZ_SEED", "24"))
    started = time.monotonic()
    outcomes, problems = [], []
    for i, base in enumerate(fuzz_bases):
        results, found = run_fuzz(base, seed + i, MODEL_FUZZ_CASES, kind="model")
        outcomes += [r["outcome"] for r in results]
        problems += found
    assert not problems, "\n".join(problems)
    assert len(outcomes) == len(fuzz_bases) * MODEL_FUZZ_CASES >= 500
    refused = sum(o.startswith("refused") for o in outcomes)
    assert 0 < refused < len(outcomes), f"{refused} of {len(outcomes)} refused"
    print(f"{len(outcomes)} mutants in {time.monotonic() - started:.1f} s, {refused} refused")


def test_fuzzed_gguf_headers_never_crash_hang_or_trace(fuzz_bases):
    """Seeded mutants (ONDEVICE_FUZZ_SEED picks another seed): each ends in one line or loads, within
    CASE_SECONDS and MAX_RSS_BYTES; and the fuzz is not vacuous (both outcomes occur)."""
    seed = int(os.environ.get("ONDEVICE_FUZZ_SEED", "24"))
    started = time.monotonic()
    outcomes, problems = [], []
    for i, base in enumerate(fuzz_bases):
        results, found = run_fuzz(base, seed + i, FUZZ_CASES)
        outcomes += [r["outcome"] for r in results]
        problems += found
    assert not problems, "\n".join(problems)
    assert len(outcomes) == len(fuzz_bases) * FUZZ_CASES
    refused = sum(o.startswith("refused") for o in outcomes)
    assert 0 < refused < len(outcomes), f"{refused} of {len(outcomes)} refused"
    print(f"{len(outcomes)} mutants in {time.monotonic() - started:.1f} s, {refused} refused")  # ~5 s on a quiet 2-core VM
