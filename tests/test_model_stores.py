"""Models other programs keep (ollama, LM Studio, the Hugging Face cache), listed and run by name
where they lie: the documented layouts in a temporary HOME, every model file hard-linked to a tiny
GGUF written here (tests/store_layouts.py). The reference for an answer is the same file run as
`--target PATH`; nothing in a store may change.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from store_layouts import (
    TENSOR,
    hf_cache_model,
    hf_cache_root,
    lmstudio_model,
    ollama_blob,
    ollama_model,
    ollama_root,
    sha256,
    store_state,
)  # fmt: skip
from tiny_models import CHATML, write_tiny_gguf

from ondevice.catalog.stores import scan_all
from ondevice.catalog.stores.derived import derived_path
from ondevice.catalog.stores.resolve import local_model
from ondevice.errors import OndeviceError
from ondevice.catalog.stores.derived import trimmed_paths

GENERATE = ["generate", "the cat sat", "--threads", "1", "--ctx", "256", "-n", "12", "--json"]
GO_TEMPLATE = "[INST] {{ if .System }}{{ .System }} {{ end }}{{ .Prompt }} [/INST]"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A tiny target (f32) and its f16 twin, the drafter; a model with another tokenizer."""
    folder = tmp_path_factory.mktemp("tiny")
    return {
        "target": write_tiny_gguf(folder / "tiny-F32.gguf", dtype="f32", chat_template=CHATML, seed=1),
        "drafter": write_tiny_gguf(folder / "tiny-F16.gguf", dtype="f16", chat_template=CHATML, seed=1),
        "other": write_tiny_gguf(folder / "other-F16.gguf", dtype="f16", vocab=300, seed=3),
    }


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A temporary HOME and ONDEVICE_HOME, no store variables, no network."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    user = tmp_path / "user"
    user.mkdir()
    for var in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "LLAMA_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "ondevice"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ONDEVICE_PYPI_INDEX", closed)
    return user


@pytest.fixture
def stores(home, tiny):
    """The tiny pair in all three stores: ollama `tiny` (+ `tiny:draft`), LM Studio, the HF cache."""
    ollama_model(home, "tiny", "latest", tiny["target"], template=GO_TEMPLATE)
    ollama_model(home, "tiny", "draft", tiny["drafter"])
    lmstudio_model(home, "tester/tiny-GGUF", tiny["target"])
    hf_cache_model(home, "org/tiny-GGUF", "tiny-F32.gguf", tiny["target"])
    return home


def ondevice(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "300", **(env or {})})


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The run's error: one line, the last, no traceback (lines before it say what it was doing)."""
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:] and "Traceback" not in result.stderr, result.stderr
    return lines[-1]


def quiet() -> Console:
    return Console(stderr=True, quiet=True)


# ---------------------------------------------------------------------------------------------
# Listing and running by name


def test_models_lists_every_store(stores, tiny):
    before = store_state(stores)
    result = ondevice("models")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip().startswith(("tiny:", "lmstudio:", "hf:"))}
    assert set(rows) == {"tiny:latest", "tiny:draft", "lmstudio:tester/tiny-GGUF", "hf:org/tiny-GGUF"}, result.stdout
    for name, store, quant in (("tiny:latest", "ollama", "F32"), ("tiny:draft", "ollama", "F16"),
                               ("lmstudio:tester/tiny-GGUF", "LM Studio", "F32"), ("hf:org/tiny-GGUF", "HF cache", "F32")):  # fmt: skip
        assert f" {store} " in rows[name] and " qwen2 " in rows[name] and f" {quant} " in rows[name] and "fits in RAM" in rows[name], rows[name]
    assert str(ollama_root(stores) / "blobs" / f"sha256-{sha256(tiny['target'])}") in rows["tiny:latest"]
    assert store_state(stores) == before  # read in place: nothing written, moved or touched


def test_names_from_a_store_are_printed_literally(home, tiny):
    lmstudio_model(home, "pub/[bold]odd-GGUF", tiny["target"])
    result = ondevice("models")
    assert result.returncode == 0 and "lmstudio:pub/[bold]odd-GGUF" in result.stdout, result.stdout


@pytest.mark.parametrize("name", ["tiny", "ollama:tiny:latest", "lmstudio:tester/tiny-GGUF", "hf:org/tiny-GGUF"])
def test_generate_by_name_answers_as_the_file_itself(stores, tiny, name):
    reference = ondevice(*GENERATE, "--target", str(tiny["target"]), "--no-draft")
    assert reference.returncode == 0, reference.stderr
    before = store_state(stores)
    result = ondevice(*GENERATE, "-m", name)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["token_ids"] == json.loads(reference.stdout)["token_ids"]
    assert "drafter: tiny:draft (ollama's" in result.stderr  # chosen among the models on disk: smaller, same tokenizer
    assert store_state(stores) == before
    home = Path(os.environ["ONDEVICE_HOME"])
    assert not [p for p in home.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"GGUF"]  # no copy of a model


def test_a_blob_is_checked_once_and_recorded_under_the_home(stores, tiny, capsys):
    console = Console(stderr=True)
    model = local_model("tiny", console)
    assert model.path == ollama_root(stores) / "blobs" / f"sha256-{sha256(tiny['target'])}" and model.label == "tiny:latest"
    first = capsys.readouterr().err
    assert "checking the sha256 of its ollama file once" in first
    assert (Path(os.environ["ONDEVICE_HOME"]) / "stores" / "verified" / f"{sha256(tiny['target'])}.json").is_file()
    local_model("tiny", console)
    assert "checking the sha256" not in capsys.readouterr().err


def test_ollamas_go_template_is_not_run_and_the_difference_is_said(stores, capsys):
    local_model("tiny", Console(stderr=True))
    note = [line for line in capsys.readouterr().err.splitlines() if "Go template" in line]
    assert note == [("tiny:latest: ondevice uses the GGUF's own chat template, not ollama's Go template, and they differ: "
                     "ollama's writes [/INST] [INST], the GGUF's <|im_end|> <|im_start|>")], note


def test_a_catalog_file_a_store_holds_is_used_in_place(home, tiny):
    from tiny_models import write_tiny_pair

    from ondevice.catalog.choose import choose

    write_tiny_pair(Path(os.environ["ONDEVICE_HOME"]), "tinypair")
    models = Path(os.environ["ONDEVICE_HOME"]) / "models"
    target, drafter = models / "tinypair-target.gguf", models / "tinypair-drafter.gguf"
    ollama_model(home, "tp", "latest", target)
    hf_cache_model(home, "org/tp", "tp-drafter.gguf", drafter)
    blob = ollama_root(home) / "blobs" / f"sha256-{sha256(target)}"
    os.unlink(target)  # only the stores hold them now (the blob is the same inode)
    os.unlink(drafter)
    files = choose("tinypair", None, None, True, quiet())
    assert files.name == "tinypair" and files.target == blob and files.target_sha256 == sha256(blob)
    assert files.drafter == hf_cache_root(home) / "models--org--tp" / "blobs" / sha256(files.drafter)  # found by its digest
    assert not target.exists() and not drafter.exists()  # nothing downloaded


def test_a_drafter_made_from_a_store_model_lives_under_the_home(stores, tiny):
    blob = ollama_root(stores) / "blobs" / f"sha256-{sha256(tiny['drafter'])}"
    trimmed, record = trimmed_paths(blob)
    home = Path(os.environ["ONDEVICE_HOME"])
    assert home in trimmed.parents and home in record.parents
    assert derived_path(tiny["drafter"], "x.onnx") == tiny["drafter"].with_name("x.onnx")  # a file of your own: beside it


# ---------------------------------------------------------------------------------------------
# What a foreign store can hold: one line each


def error_of(text: str) -> str:
    with pytest.raises(OndeviceError) as caught:
        local_model(text, quiet())
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_manifest_whose_blob_is_missing(home, tiny):
    ollama_model(home, "gone", "latest", tiny["target"], digest="ab" * 32, link_blob=False)
    assert f"gone:latest (ollama, {ollama_root(home)}/blobs/sha256-{'ab' * 32}) cannot run: its model blob is missing (`ollama pull gone:latest`)." == error_of("gone")


def test_a_blob_being_pulled_is_a_partial_download(home, tiny):
    ollama_model(home, "pulling", "latest", tiny["target"], digest="cd" * 32, link_blob=False)
    (ollama_root(home) / "blobs" / f"sha256-{'cd' * 32}-partial").write_bytes(b"GGUF")
    assert "a partial download (`ollama pull pulling:latest` finishes it)" in error_of("pulling")


def test_a_blob_shorter_than_its_manifest_says(home, tiny):
    ollama_model(home, "short", "latest", tiny["target"], size=tiny["target"].stat().st_size + 1000)
    assert "is a partial download (386,720 of 387,720 bytes)" in error_of("short")


def test_an_mlx_model_is_safetensors_not_gguf(home):
    tensor = {"mediaType": TENSOR, "digest": f"sha256:{ollama_blob(home, b'x' * 64)}", "size": 64, "name": "model.embed_tokens.weight"}
    ollama_model(home, "mlx", "latest", None, layers=[tensor])
    assert "ollama keeps it as safetensors tensors for its MLX engine, not as a GGUF" in error_of("mlx")


def test_a_model_layer_holding_safetensors(home, tmp_path):
    fake = tmp_path / "model.safetensors"
    header = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    fake.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    ollama_model(home, "st", "latest", fake)
    assert "is safetensors, not GGUF" in error_of("st")


def test_a_symlink_loop_and_a_dangling_link(home, tiny):
    snapshot = hf_cache_model(home, "org/loop-GGUF", "a-F32.gguf", tiny["target"]).parent
    (snapshot / "b-F16.gguf").symlink_to("../../loop")
    (snapshot.parent.parent / "loop").symlink_to(snapshot / "b-F16.gguf")
    (snapshot / "d-Q8_0.gguf").symlink_to("../../blobs/" + "ef" * 32)
    assert "b-F16.gguf is a symbolic link that loops" in error_of("hf:org/loop-GGUF:F16")
    assert "which does not exist" in error_of("hf:org/loop-GGUF/d-Q8_0.gguf")
    assert local_model("hf:org/loop-GGUF:F32", quiet()).path.name == "a-F32.gguf"  # the good file still runs


def test_an_ambiguous_name_lists_the_candidates(home, tiny):
    hf_cache_model(home, "org/two-GGUF", "two-F32.gguf", tiny["target"])
    hf_cache_model(home, "org/two-GGUF", "two-F16.gguf", tiny["drafter"])
    message = error_of("hf:org/two-GGUF")
    assert message == ("hf:org/two-GGUF names 2 models on this machine: hf:org/two-GGUF:F16 (HF cache), "
                       "hf:org/two-GGUF:F32 (HF cache); name one of them.")
    assert local_model("hf:org/two-GGUF:F16", quiet()).path.name == "two-F16.gguf"


def test_an_unknown_tag_names_the_ones_there(home, tiny):
    ollama_model(home, "tiny", "draft", tiny["drafter"])
    message = error_of("tiny:7b")
    assert message.startswith("no file, catalog pair (") and "is named 'tiny:7b'" in message and message.endswith("(there: tiny:draft).")


def test_a_partial_hf_download_is_listed_and_fetched_again(home, tiny):
    blobs = hf_cache_root(home) / "models--org--part-GGUF" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / ("12" * 32 + ".incomplete")).write_bytes(tiny["target"].read_bytes()[:1000])
    row = [m for m in scan_all().models if m.store == "HF cache"]
    assert len(row) == 1 and row[0].problem.startswith("a partial download") and "`hf download org/part-GGUF`" in row[0].problem
    assert "the Hugging Face Hub is offline" in error_of("hf:org/part-GGUF:Q4_K_M")  # not cached whole: downloaded here instead


def test_a_store_not_readable_is_one_line(home, tiny, monkeypatch):
    ollama_model(home, "tiny", "latest", tiny["target"])
    locked = ollama_root(home) / "manifests"
    listdir = Path.iterdir

    def refuse(path):
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)

    monkeypatch.setattr(Path, "iterdir", refuse)
    scan = scan_all()
    assert scan.models == [] and len(scan.unreadable) == 1
    assert scan.unreadable[0].startswith(f"ollama's folder {locked} is not readable by this user (it belongs to ")
    assert scan.unreadable[0] in error_of("tiny")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder")
def test_a_store_of_another_mode_is_one_line_on_the_command_line(home, tiny):
    ollama_model(home, "tiny", "latest", tiny["target"])
    locked = ollama_root(home) / "manifests"
    locked.chmod(0)
    try:
        assert "is not readable by this user" in one_line_error(ondevice(*GENERATE, "-m", "tiny"))
    finally:
        locked.chmod(0o755)


def test_a_damaged_blob_is_refused_and_left_alone(home, tiny, tmp_path):
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(tiny["target"].read_bytes()[:-1] + b"\x01")
    ollama_model(home, "bad", "latest", damaged, digest=sha256(tiny["target"]))
    line = one_line_error(ondevice(*GENERATE, "-m", "bad"))
    assert "has sha256" in line and "its ollama copy is damaged: fetch it again with ollama" in line
    assert (ollama_root(home) / "blobs" / f"sha256-{sha256(tiny['target'])}").read_bytes() == damaged.read_bytes()


def test_without_a_drafter_on_disk_one_is_proposed_with_its_size(home, tiny):
    ollama_model(home, "tiny", "latest", tiny["target"])
    result = ondevice(*GENERATE, "-m", "tiny")
    assert result.returncode == 0, result.stderr
    proposed = result.stderr.index("proposed drafter: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB)")
    assert proposed < result.stderr.index("no compatible drafter found")  # offline here: proposed, then not had


def test_a_manifest_that_is_not_json_or_nested_too_deep(home):
    for name, text in (("garbage", "{not json"), ("deep", "[" * 100_000 + "]" * 100_000)):
        path = ollama_root(home) / "manifests" / "registry.ollama.ai" / "library" / name / "latest"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        assert f"its manifest {path} cannot be read (" in error_of(name)


def test_a_truncated_gguf_is_one_line_where_it_is_listed_and_run(home, tiny, tmp_path):
    cut = tmp_path / "cut-F32.gguf"
    cut.write_bytes(tiny["target"].read_bytes()[:200_000])  # an interrupted copy: the header is whole, the tensors are not
    lmstudio_model(home, "tester/cut-GGUF", cut)
    listing = ondevice("models")
    row = next(line for line in listing.stdout.splitlines() if "lmstudio:tester/cut-GGUF" in line)
    assert "cannot run:" in row, listing.stdout
    line = one_line_error(ondevice(*GENERATE, "-m", "lmstudio:tester/cut-GGUF"))
    assert "cut-F32.gguf" in line, line
