"""The llama-cpp-python bench rows (bench/llamacpp_rows.py) on a tiny pair: llama-cpp-python's own
greedy decoding and its speculative decoding with our greedy-chain draft model give the answer
ondevice's target alone gives (f32 tiny models: batch noise far below their logit margins)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from ondevice.errors import OndeviceError
from ondevice.bench import llamacpp_rows
from ondevice.machine import llama_repack
from ondevice.eval import llamacpp_rows as rows_script
from ondevice.targets.llama_target import LlamaTarget
from ondevice.catalog.choose import choose
from ondevice.bench.prompt_sets import CODE_EVAL
from ondevice.prompt.tokenizer import Tokenizer
from tiny_models import write_tiny_gguf, write_tiny_pair

PROMPTS = [[5, 17, 42, 99, 7], [120, 3, 3, 250, 61, 8, 19]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llamacpp-rows")
    target = write_tiny_gguf(folder / "target.gguf", arch="llama", seed=0, head_scale=3.0)
    drafter = write_tiny_gguf(folder / "drafter.gguf", arch="llama", seed=0, head_scale=3.0, noise=0.3)
    return SimpleNamespace(target=target, drafter=drafter)


def never_ends(token: int) -> bool:
    return False


def ondevice_alone(path, prompt, n) -> list[int]:
    engine = SpecEngine(LlamaTarget(path, n_ctx=256, threads=1), None, never_ends)
    return collect(engine.generate(prompt, n))[0]


@pytest.mark.parametrize("name", ["llama-cpp", "llama-cpp-spec@3"])
def test_rows_give_the_target_alones_answers(pair, name):
    reference = [ondevice_alone(pair.target, p, 24) for p in PROMPTS]
    result, outputs = llamacpp_rows.run_named(llamacpp_rows.llamacpp_name(name), pair, 256, 1, PROMPTS, 24, never_ends)
    assert outputs == reference
    assert result.prompts == 2 and result.totals.tokens == 2 * 23 and result.totals.decode_seconds > 0  # the first token comes with the prefill
    assert result.config == llamacpp_rows.label(llamacpp_rows.llamacpp_name(name))


def test_baseline_names():
    assert llamacpp_rows.llamacpp_name("llama-cpp-spec") == "llama-cpp-spec@4"
    for bad in ("llama", "llama-cpp@3", "llama-cpp-spec@0", "llama-cpp-spec@x"):
        with pytest.raises(OndeviceError, match="unknown baseline"):
            llamacpp_rows.llamacpp_name(bad)


def test_the_rows_run_in_a_process_of_their_own_from_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    out = tmp_path / "rows.json"
    rows_script.main(["--pair", "tiny", "--prompts", "code", "--limit", "1", "--max-tokens", "12", "--ctx", "512", "--threads", "1",
                      "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    models = choose("tiny", None, None, True)
    tokenizer = Tokenizer(models.target)
    ids = tokenizer.encode_user(CODE_EVAL[0])
    engine = SpecEngine(LlamaTarget(models.target, n_ctx=512, threads=1), None, tokenizer.is_end)
    reference = collect(engine.generate(ids, 12))[0]
    assert row["outputs"] == [reference] and row["config"] == "llama-cpp-python, target alone"
    assert row["tokens"] == len(reference) - 1 and row["peak_rss_bytes"] > 0


def test_the_amx_guard_reaches_the_params_llama_loads_with(pair, monkeypatch):
    """On an AMX CPU whose build's AMX kernels crash, the baseline's Llama must load without llama.cpp's
    extra buffer types: the guard must patch the function Llama.__init__ actually calls; where they
    run, Llama keeps its default."""
    monkeypatch.setattr(llama_repack, "cpu_has_amx", lambda: True)
    for runs in (False, True):
        monkeypatch.setattr(llama_repack, "repack_runs", lambda model: runs)
        llm = llamacpp_rows.load_llama(pair.target, 64, 1)
        try:
            assert llm.model_params.use_extra_bufts is runs
        finally:
            llm.close()
