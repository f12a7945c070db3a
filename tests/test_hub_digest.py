"""Catalog entries whose sha256 comes from the hub (`sha256 = "hub"`), and split models.

The hub is tests/fake_hub.py: a real HTTP server with the routes huggingface_hub calls, so the real
client reads the file metadata (X-Linked-Etag = the LFS sha256) and downloads the bytes. The
reference for every check is the bytes the test published and their sha256 computed here.
"""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest
from fake_hub import FakeHub
from rich.console import Console

from ondevice.catalog import hf_source, hub
from ondevice.catalog.pairs import load_pair
from ondevice.errors import OndeviceError

REPO = "someone/model-GGUF"


def catalog(home, target_file: str, drafter_file: str = "small.gguf") -> None:
    (home / "catalog").mkdir(parents=True, exist_ok=True)
    text = f'''name = "hubpair"
[target]
label = "Big"
file = "{target_file}"
hf_repo = "{REPO}"
hf_file = "{target_file}"
sha256 = "hub"
approx_size = 1000
[drafter]
label = "Small"
file = "{drafter_file}"
hf_repo = "{REPO}"
hf_file = "{drafter_file}"
sha256 = "hub"
'''
    (home / "catalog" / "hubpair.toml").write_text(text)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    server = FakeHub()
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hf_source._hub_reachable.cache_clear()
    yield server
    server.close()


def quiet() -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, width=300), text


def files_in(home) -> list[str]:
    folder = home / "models"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_digest_from_hub_is_checked_and_recorded(fake_hub, tmp_path):
    home = tmp_path / "home"
    big, small = os.urandom(300_000), os.urandom(50_000)
    fake_hub.publish(REPO, "big.gguf", big)
    fake_hub.publish(REPO, "small.gguf", small)
    catalog(home, "big.gguf")
    pair = load_pair("hubpair")
    assert pair.target.sha256 is None and pair.target.size is None and pair.target.approx_size == 1000
    files = hub.ensure_pair(pair, quiet()[0])
    assert files.target.read_bytes() == big and files.drafter.read_bytes() == small
    marker = json.loads((home / "models" / "big.gguf.verified").read_text())
    assert marker["sha256"] == hashlib.sha256(big).hexdigest() and marker["source"] == "hub"
    assert hub.digest_of(pair.target) == hashlib.sha256(big).hexdigest()
    assert files_in(home) == ["big.gguf", "big.gguf.lock", "big.gguf.verified", "small.gguf", "small.gguf.lock", "small.gguf.verified"]
    fake_hub.requests.clear()
    hub.ensure_pair(pair, quiet()[0], force=True)  # rehashed against the recorded digest: no hub needed
    assert fake_hub.requests == []


def test_hub_digest_that_does_not_match_the_bytes_is_refused(fake_hub, tmp_path):
    home = tmp_path / "home"
    fake_hub.publish(REPO, "big.gguf", os.urandom(100_000))
    fake_hub.lie_about(REPO, "big.gguf")
    catalog(home, "big.gguf")
    with pytest.raises(OndeviceError, match=r"could not download Big: Hugging Face Hub: big.gguf has sha256 .*expected") as caught:
        hub.ensure_file(load_pair("hubpair").target, quiet()[0])
    assert "\n" not in str(caught.value)
    assert [name for name in files_in(home) if not name.endswith(".lock")] == []  # no file, no staging folder


def test_file_without_an_lfs_sha256_is_refused(fake_hub, tmp_path):
    home = tmp_path / "home"
    fake_hub.publish(REPO, "big.gguf", b"GGUF tiny")
    fake_hub.not_lfs.add((REPO, "big.gguf"))
    catalog(home, "big.gguf")
    with pytest.raises(OndeviceError, match="the hub gives no sha256 for someone/model-GGUF/big.gguf"):
        hub.ensure_file(load_pair("hubpair").target, quiet()[0])
    assert fake_hub.downloads() == []


def test_split_model_downloads_as_a_set_verified_part_by_part(fake_hub, tmp_path):
    home = tmp_path / "home"
    names = [f"big-q4_k_m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    parts = [os.urandom(n) for n in (120_000, 80_000, 40_000)]
    for name, data in zip(names, parts):
        fake_hub.publish(REPO, name, data)
    fake_hub.publish(REPO, "small.gguf", b"s" * 1000)
    catalog(home, names[0])
    target = load_pair("hubpair").target
    assert [part.file for part in target.parts()] == names
    fake_hub.lie_about(REPO, names[1])  # part 2 arrives corrupted
    console, text = quiet()
    with pytest.raises(OndeviceError, match=rf"{names[1]} has sha256"):
        hub.ensure_file(target, console)
    assert (home / "models" / names[0]).read_bytes() == parts[0]  # part 1 verified and kept
    assert not (home / "models" / names[1]).exists() and not (home / "models" / names[2]).exists()
    fake_hub.publish(REPO, names[1], parts[1])  # the hub is right again
    fake_hub.requests.clear()
    console, text = quiet()
    path = hub.ensure_file(target, console)
    assert path == home / "models" / names[0]
    assert fake_hub.downloads() == [f"{REPO}/{name}" for name in names[1:]]  # only what was missing
    assert [(home / "models" / name).read_bytes() for name in names] == parts
    assert hub.is_downloaded(target) and text.getvalue().count("success") == 1
    assert hub.downloaded_bytes(target) == sum(map(len, parts))


def test_file_placed_by_hand_is_checked_not_downloaded(fake_hub, tmp_path):
    home = tmp_path / "home"
    data = os.urandom(10_000)
    fake_hub.publish(REPO, "big.gguf", data)
    catalog(home, "big.gguf")
    (home / "models").mkdir(parents=True)
    (home / "models" / "big.gguf").write_bytes(data)
    hub.ensure_file(load_pair("hubpair").target, quiet()[0])
    assert fake_hub.downloads() == [] and hub.is_downloaded(load_pair("hubpair").target)


def test_unreachable_hub_fails_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    with __import__("socket").socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_ENDPOINT", closed)
    hf_source._hub_reachable.cache_clear()
    catalog(tmp_path / "home", "big-00001-of-00002.gguf")
    with pytest.raises(OndeviceError, match=r"cannot download Big: the Hugging Face Hub is unreachable .*check your network") as caught:
        hub.ensure_file(load_pair("hubpair").target, quiet()[0])
    assert "\n" not in str(caught.value)
    assert files_in(tmp_path / "home") == []


def test_models_lists_and_rm_deletes_a_pair(fake_hub, tmp_path):
    from typer.testing import CliRunner

    from ondevice.cli.app import app

    home = tmp_path / "home"
    names = [f"big-{i:05d}-of-00002.gguf" for i in (1, 2)]
    for name in names + ["small.gguf"]:
        fake_hub.publish(REPO, name, os.urandom(5000))
    catalog(home, names[0])
    hub.ensure_pair(load_pair("hubpair"), quiet()[0])
    (home / "models" / "mine.gguf").write_bytes(b"GGUF")  # a file of one's own: listed apart
    runner = CliRunner()
    listing = runner.invoke(app, ["models"], env={"COLUMNS": "250"})
    assert listing.exit_code == 0, listing.output
    row = next(line for line in listing.stdout.splitlines() if line.strip().startswith("hubpair"))
    assert "Big" in row and "10 kB" in row and "5.0 kB" in row and " yes " in row and row.rstrip().endswith("? (unreadable GGUF header)")
    assert "mine.gguf" in listing.stdout
    refused = runner.invoke(app, ["rm", "hubpair"])  # no terminal, no --yes: nothing happens
    assert refused.exit_code == 1 and "pass --yes" in str(refused.exception)
    assert (home / "models" / names[1]).exists()
    removed = runner.invoke(app, ["rm", "hubpair", "--yes"])
    assert removed.exit_code == 0, removed.output
    assert sorted(p.name for p in (home / "models").iterdir()) == ["mine.gguf"]
    assert "no" in next(line for line in runner.invoke(app, ["models"], env={"COLUMNS": "250"}).stdout.splitlines() if "hubpair" in line)


def test_rm_keeps_a_file_another_downloaded_pair_uses(fake_hub, tmp_path):
    from ondevice.cli.models_cmd import files_to_remove

    home = tmp_path / "home"
    for name in ("big.gguf", "small.gguf", "other-big.gguf"):
        fake_hub.publish(REPO, name, os.urandom(3000))
    catalog(home, "big.gguf")
    text = (home / "catalog" / "hubpair.toml").read_text().replace('name = "hubpair"', 'name = "second"')
    (home / "catalog" / "second.toml").write_text(text.replace('"big.gguf"', '"other-big.gguf"'))
    hub.ensure_pair(load_pair("hubpair"), quiet()[0])
    hub.ensure_pair(load_pair("second"), quiet()[0])
    doomed, kept = files_to_remove(load_pair("hubpair"))
    assert {p.name for p in doomed} == {"big.gguf", "big.gguf.verified", "big.gguf.lock"}
    assert [(p.name, users) for p, users in kept] == [("small.gguf", ["second"])]


def test_quant_reference_picks_the_file_like_llama_cpp(fake_hub, tmp_path):
    from ondevice.catalog import refs

    names = ["README.md", "model-Q8_0.gguf", "model-q4_k_m-00001-of-00002.gguf", "model-q4_k_m-00002-of-00002.gguf", "mmproj-Q4_K_M.gguf"]
    for name in names:
        fake_hub.publish(REPO, name, os.urandom(100))
    (tmp_path / "home").mkdir()
    model = refs.model_file(refs.parse_hf(f"hf:{REPO}:Q4_K_M"))  # asks the hub's file list
    assert model.hf_file == "model-q4_k_m-00001-of-00002.gguf" and model.file == f"hf/{REPO}/model-q4_k_m-00001-of-00002.gguf"
    assert [part.hf_file for part in model.parts()] == names[2:4]
    assert refs.model_file(refs.parse_hf(f"hf:{REPO}:q8_0")).hf_file == "model-Q8_0.gguf"
    with pytest.raises(OndeviceError, match=r"no GGUF file for quantization IQ2_XS; its GGUF files: model-Q8_0.gguf, model-q4_k_m.gguf"):
        refs.model_file(refs.parse_hf(f"hf:{REPO}:IQ2_XS"))
    path = refs.local_model(f"hf:{REPO}:Q4_K_M", quiet()[0])  # downloads both parts, verified
    assert path.read_bytes() == fake_hub.files[(REPO, names[2])] and path.with_name(names[3]).exists()


def test_cli_download_with_no_hub_fails_in_one_line_and_leaves_nothing(tmp_path):
    """The console script as a user runs it: exit code 1, one line on stderr naming the network."""
    import subprocess
    import sys

    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    env = {**os.environ, "ONDEVICE_HOME": str(tmp_path / "home"), "HF_ENDPOINT": closed}
    env.pop("HF_HUB_OFFLINE", None)
    for ref in (f"hf:{REPO}/big-q4_k_m-00001-of-00003.gguf", f"hf:{REPO}:Q4_K_M"):
        done = subprocess.run([sys.executable, "-m", "ondevice", "download", ref], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and done.stdout == ""
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: cannot ") and "Hugging Face Hub is unreachable" in lines[0], done.stderr
        assert "check your network connection" in lines[0]
    assert not (tmp_path / "home").exists()


def test_split_model_fills_one_progress_bar(fake_hub, tmp_path, monkeypatch):
    from rich.progress import Progress

    home = tmp_path / "home"
    names = [f"big-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    parts = [os.urandom(n) for n in (70_000, 50_000, 30_000)]
    for name, data in zip(names, parts):
        fake_hub.publish(REPO, name, data)
    catalog(home, names[0])
    bars: list[Progress] = []

    def recording_progress(console):
        bars.append(Progress(console=console, disable=True))
        return bars[-1]

    monkeypatch.setattr(hub, "_progress", recording_progress)
    hub.ensure_file(load_pair("hubpair").target, quiet()[0])
    downloads = [task for bar in bars for task in bar.tasks if not task.description.startswith("verifying")]
    assert [(t.description, t.total, t.completed) for t in downloads] == [("Big", sum(map(len, parts)), sum(map(len, parts)))]


def test_a_downloaded_quant_reference_needs_no_hub(fake_hub, tmp_path, monkeypatch):
    from ondevice.catalog import refs

    fake_hub.publish(REPO, "model-Q4_K_M.gguf", os.urandom(1000))
    path = refs.local_model(f"hf:{REPO}:Q4_K_M", quiet()[0])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.requests.clear()
    assert refs.local_model(f"hf:{REPO}:q4_k_m", quiet()[0]) == path
    assert refs.local_model(f"hf:{REPO}/model-Q4_K_M.gguf", quiet()[0]) == path
    assert fake_hub.requests == []
    with pytest.raises(OndeviceError, match="cannot look up .*Q8_0: the Hugging Face Hub is offline"):
        refs.local_model(f"hf:{REPO}:Q8_0", quiet()[0])
    stat = path.stat()
    path.write_bytes(bytes(1000))  # corrupted in place, same size, its date set back: the ctime moved (verified.py)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # so it is hashed again against the recorded digest, with no hub: the bad file goes
    with pytest.raises(OndeviceError, match="the Hugging Face Hub is offline"):
        refs.local_model(f"hf:{REPO}:Q4_K_M", quiet()[0])
    assert not path.exists()


def test_models_says_where_the_target_would_live_by_the_memory_plan(fake_hub, tmp_path):
    from tiny_models import write_tiny_gguf

    from ondevice.cli.placement_view import model_size, target_place
    from ondevice.loading.memory import plan_memory
    from ondevice.machine.ram import RamBudget

    home = tmp_path / "home"
    fake_hub.publish(REPO, "big.gguf", write_tiny_gguf(tmp_path / "t.gguf", "qwen2", seed=1).read_bytes())
    fake_hub.publish(REPO, "small.gguf", write_tiny_gguf(tmp_path / "d.gguf", "qwen2", seed=2).read_bytes())
    catalog(home, "big.gguf")
    pair = load_pair("hubpair")
    assert target_place(pair) == "?"  # not downloaded and no shape preset: nothing to plan with
    hub.ensure_pair(pair, quiet()[0])
    target, drafter = model_size(pair.target), model_size(pair.drafter)
    assert target.file_bytes == (home / "models" / "big.gguf").stat().st_size and target.n_vocab == 320
    plan = plan_memory(target, drafter, budget=RamBudget(10**12, "test"), process_bytes=0)
    assert target_place(pair, RamBudget(10**12, "test")) == "fits in RAM"
    tight = RamBudget(plan.resident_bytes + target.file_bytes // 2, "test")  # room for the drafter and buffers, not the target
    assert target_place(pair, tight).startswith("streams from disk") == plan_memory(target, drafter, budget=tight).streams


def test_models_gpu_column_is_the_loaders_placement(fake_hub, tmp_path, monkeypatch):
    """The placement the torch loader would make (plan_offload), here on a CPU "device" with a budget
    that keeps 3 of 8 layers: what `ondevice models` shows on a GPU machine."""
    import torch
    import tiny_models

    from ondevice.cli.placement_view import gpu_place
    from ondevice.targets.offloaded import plan_offload
    from ondevice.decode.protocols import MAX_BUDGET

    home = tmp_path / "home"
    monkeypatch.setitem(tiny_models.DIMS, "num_hidden_layers", 8)
    fake_hub.publish(REPO, "big.gguf", tiny_models.write_tiny_gguf(tmp_path / "t.gguf", "qwen2", seed=1).read_bytes())
    fake_hub.publish(REPO, "small.gguf", b"x")
    catalog(home, "big.gguf")
    target = load_pair("hubpair").target
    assert gpu_place(target, "cpu") == "planned once downloaded"
    hub.ensure_file(target, quiet()[0])
    everything = plan_offload(hub.local_path(target), "cpu", torch.float32, 4096, "1TB", "1TB", max_tree=MAX_BUDGET)
    layer = max(layout.decoded_bytes for layout in everything.layouts.values())
    moved = max(layout.nbytes for layout in everything.layouts.values())
    budget = everything.resident_bytes + 2 * moved + layer + 3 * layer  # ring slots, decode scratch, 3 layers
    shown = gpu_place(target, "cpu", str(budget), "1TB")
    assert shown.startswith("8 layers: 3 on CPU, 5 streamed from RAM, 0 from disk; ")
    assert shown == plan_offload(hub.local_path(target), "cpu", torch.float32, 4096, str(budget), "1TB", max_tree=MAX_BUDGET).placement.describe()
