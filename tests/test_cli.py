"""The CLI as a user meets it: one-line errors with a non-zero exit for bad input, printed as they are
(markup, invalid UTF-8, control characters), and a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ondevice.errors import OndeviceError
from ondevice.prompt.tokenizer import Tokenizer, check_same_vocab
from tiny_models import write_tiny_gguf


def ondevice(*args: str, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def empty_home(home) -> dict[str, str]:
    """An environment with ONDEVICE_HOME at `home` (no models) and no hub or package index to download from."""
    return {"ONDEVICE_HOME": str(home), "HF_HUB_OFFLINE": "1", "ONDEVICE_PYPI_INDEX": "http://127.0.0.1:9/simple"}


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "args,words",
    [
        (["generate", "hi", "--model", "no-such-pair"], ["no-such-pair"]),
        (["generate", "hi", "--tree", "chain", "--budget", "0"], ["--budget"]),
        (["generate", "hi", "--tree", "chain", "--budget", "100000"], ["--budget"]),
        (["generate", "hi", "--tree", "bushy"], ["bushy"]),
        (["generate", "hi", "--temperature", "-1"], ["temperature"]),
        (["generate", "hi", "--temperature", "1e-320"], ["temperature must be 0 (greedy) or between", "1e-320"]),
        (["generate", "hi", "--temperature", "nan"], ["temperature must be", "nan"]),
        (["generate", "hi", "--temperature", "1e300"], ["temperature must be"]),
        (["generate", "hi", "--top-p", "1.5"], ["top-p"]),
        (["generate", "hi", "--top-p", "1e-320"], ["top-p must be between"]),
        (["generate", "hi", "--top-k", "99999999999"], ["top-k must be between"]),
        (["generate", "hi", "--seed", "-1"], ["seed must be between"]),
        (["chat", "--temperature", "1e-320"], ["temperature must be"]),
        (["serve", "--temperature", "1e-320"], ["temperature must be"]),
        (["generate", "hi", "--target-backend", "tensorflow"], ["tensorflow"]),
        (["generate", "hi", "--drafter-backend", "tpu"], ["tpu"]),
        (["bench", "--backends", "onnx"], ["TARGET/DRAFTER", "onnx"]),
        (["generate", "hi", "--target-backend", "torch", "--gpu-memory", "lots"], ["lots"]),
    ],
)
def test_bad_input_is_one_line_error(tmp_path, args, words):
    """In an empty home with no network: an option that slipped through would fail on the missing
    model, never load or download one."""
    assert_one_line_error(ondevice(*args, env=empty_home(tmp_path)), *words)


@pytest.mark.parametrize("name", ["a[/x]b", "[bold]loud[/bold]", "[/]", "x\x1b[31mred"])
def test_error_text_is_printed_as_it_is(tmp_path, name):
    """Rich markup in an error (here a model name echoed back) crashed the error printer ([/x]: a
    MarkupError traceback) or was eaten ([bold]); a control character would drive the terminal."""
    result = ondevice("generate", "hi", "-m", name, env=empty_home(tmp_path))
    assert_one_line_error(result, f"is named {name!r}")
    assert "\x1b" not in result.stderr


def test_prompt_that_is_not_utf8_is_one_line_before_anything_loads(tmp_path):
    """Bytes that are not UTF-8 on the command line (Python carries them as surrogates): one line
    naming the byte, before the model is looked for (this home has none and no network)."""
    result = subprocess.run([sys.executable.encode(), b"-m", b"ondevice", b"generate", b"caf\xe9 \xff"], capture_output=True,
                            timeout=120, env={**os.environ, **empty_home(tmp_path)})
    decoded = subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(), result.stderr.decode("utf-8", "replace"))
    assert_one_line_error(decoded, "the prompt holds the byte 0xE9, which is not UTF-8, at character 3")
    assert not (tmp_path / "models").exists()


def test_mismatched_tokenizers_are_refused(tmp_path):
    a = Tokenizer(write_tiny_gguf(tmp_path / "a.gguf", vocab=320))
    b = Tokenizer(write_tiny_gguf(tmp_path / "b.gguf", vocab=300))
    check_same_vocab(a, Tokenizer(write_tiny_gguf(tmp_path / "a2.gguf", vocab=320, seed=1)))  # same vocab: fine
    with pytest.raises(OndeviceError, match="different tokenizers"):
        check_same_vocab(a, b)


def test_corrupt_model_file_is_refused(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all" * 100)
    with pytest.raises(OndeviceError):
        Tokenizer(bad)
    with pytest.raises(OndeviceError):
        Tokenizer(tmp_path / "missing.gguf")


@pytest.mark.real
def test_generate_json_speculative_equals_no_draft(real_pair):
    """`ondevice generate --json` end to end on the real pair: same tokens with and without drafting."""
    common = ["generate", "Write a Python function that returns the square of a number.", "--json", "-n", "32",
              "--target-backend", "llama", "--threads", "2"]
    plain = json.loads(ondevice(*common, "--no-draft").stdout)
    spec = json.loads(ondevice(*common, "--tree", "chain", "--budget", "4").stdout)  # passes of 5 tokens
    for key in ("text", "prompt_token_ids", "token_ids", "target_passes", "tokens_per_pass", "tokens_per_second",
                "draft_seconds", "verify_seconds", "tree", "budget", "target_backend", "placement", "bytes_streamed_per_pass"):
        assert key in spec
    assert plain["target_passes"] == len(plain["token_ids"])  # one token per pass alone
    assert spec["target_passes"] < plain["target_passes"] and spec["tree"] == "chain"
    if spec["token_ids"] != plain["token_ids"]:  # allowed only at near-ties (batched passes: other kernels)
        from ondevice.eval.numerics import greedy_misses, pass_noise
        from ondevice.targets.llama_target import LlamaTarget

        target, prompt = LlamaTarget(real_pair.target, n_ctx=1024, threads=2), plain["prompt_token_ids"]
        noise = pass_noise(target, prompt, plain["token_ids"], range(2, 6))  # this machine's, passes <= 5
        ends = Tokenizer(real_pair.target).end_ids() if spec["finish_reason"] == "stop" else None  # where it stopped, too
        assert not greedy_misses(target, prompt, spec["token_ids"], noise, ends)[1], f"not near-ties (noise {noise:.3f})"
    else:
        assert spec["text"] == plain["text"]


@pytest.mark.real
def test_prompt_longer_than_context_is_one_line_error(real_pair):
    result = ondevice("generate", "word " * 300, "--ctx", "128", "--target-backend", "llama", "--no-draft")
    assert_one_line_error(result, "context")


@pytest.mark.parametrize("columns", [80, 200])
def test_models_fits_the_terminal_with_every_name_whole_and_where_each_target_would_live(tmp_path, columns):
    """At 80 columns (two lines per pair) and at 200 (one line): no line wider than the terminal,
    every catalog pair's name whole at the start of its row, and the "on this machine" column there."""
    from ondevice.catalog.pairs import list_pairs

    run = ondevice("models", env={**empty_home(tmp_path), "COLUMNS": str(columns)})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    names = [pair.name for pair in list_pairs()]
    last = max(i for i, line in enumerate(lines) if line.strip().split("  ")[0].removesuffix(" *") in names)
    end = next((i for i in range(last + 1, len(lines)) if not lines[i].strip()), len(lines))  # the stores' listing follows
    assert all(len(line) <= columns for line in lines[:end]), run.stdout
    rows = [line.strip() for line in lines]
    assert any(row.startswith("name") and row.endswith("on this machine") for row in rows)
    starts = {row.split("  ")[0].removesuffix(" *") for row in rows}
    for pair in list_pairs():
        assert pair.name in starts, f"{pair.name} is not whole at the start of a row:\n{run.stdout}"
        assert any(row.startswith(pair.name) and ("RAM" in row or "disk" in row) for row in rows)  # its place, on its line
