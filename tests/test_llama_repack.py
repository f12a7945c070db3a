"""machine/llama_repack: whether llama.cpp's repacked layouts run here, probed in a child, saved per build."""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
import pytest

from ondevice.machine import llama_repack, repack_layouts
from tiny_models import write_tiny_gguf

LIBRARY = llama_repack.LIB_DIR / "libggml-cpu.so"


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(llama_repack, "_verdicts", {})
    return tmp_path / "home"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", arch="qwen2")


def saved(home: Path) -> dict:
    return json.loads((home / "machine" / llama_repack.SAVED).read_text())


def test_the_probe_runs_a_model_whose_weights_llama_cpp_keeps_as_they_are(tiny):
    """f32 weights have no repacked layout: the child loads and decodes them on every CPU."""
    assert llama_repack.repacked_batch_runs(tiny)


def test_a_child_that_fails_for_another_reason_gives_no_verdict(tmp_path):
    """Not a model, or a child killed for memory under a limit: nothing is known of the kernels."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    assert llama_repack.repacked_batch_runs(bad) is None


def test_the_verdict_is_probed_once_and_saved_per_build_and_weight_types(home, tiny):
    assert llama_repack.runs_here(tiny, LIBRARY, ["F32"])
    first = saved(home)
    assert first == {"library": llama_repack.library_identity(LIBRARY), "runs": {"F32": True}}
    missing = tiny.parent / "moved-away.gguf"  # the saved verdict answers without a child: no model needed
    llama_repack._verdicts.clear()
    assert llama_repack.runs_here(missing, LIBRARY, ["F32"])
    assert not llama_repack.runs_here(missing, LIBRARY, ["Q4_K"])  # new types, and no model to probe with
    assert saved(home)["runs"] == {"F32": True}  # nothing known of the build: nothing saved


def test_one_crash_condemns_the_build_and_a_new_build_is_probed_again(home, tiny):
    identity = llama_repack.library_identity(LIBRARY)
    (home / "machine").mkdir(parents=True)
    (home / "machine" / llama_repack.SAVED).write_text(json.dumps({"library": identity, "runs": {"Q4_K,Q6_K": False}}))
    assert not llama_repack.runs_here(tiny, LIBRARY, ["F32"])  # the AMX tile configuration is every kernel's
    (home / "machine" / llama_repack.SAVED).write_text(json.dumps({"library": [str(LIBRARY), 1, 2], "runs": {"F32": False}}))
    llama_repack._verdicts.clear()
    assert llama_repack.runs_here(tiny, LIBRARY, ["F32"])  # another build's verdict does not count
    assert saved(home)["library"] == identity


def test_loads_repack_only_where_the_verdict_allows(home, tiny, monkeypatch):
    monkeypatch.setattr(llama_repack, "cpu_has_amx", lambda: False)
    assert llama_repack.repack_runs(tiny) and not (home / "machine").exists()  # no AMX: nothing to probe
    monkeypatch.setattr(llama_repack, "cpu_has_amx", lambda: True)
    monkeypatch.delenv("ONDEVICE_AMX", raising=False)
    assert not llama_repack.repack_runs(tiny) and not (home / "machine").exists()  # AMX, not asked for: no probe
    monkeypatch.setenv("ONDEVICE_AMX", "1")
    identity = llama_repack.library_identity(LIBRARY)
    (home / "machine").mkdir(parents=True)
    (home / "machine" / llama_repack.SAVED).write_text(json.dumps({"library": identity, "runs": {"Q8_0": False}}))
    assert not llama_repack.repack_runs(tiny)
    with repack_layouts.weight_layout_guard(tiny):
        assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is False
    llama_repack._verdicts.clear()
    (home / "machine" / llama_repack.SAVED).unlink()
    assert llama_repack.repack_runs(tiny)  # the tiny model's f32 weights run
    with repack_layouts.weight_layout_guard(tiny):
        assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True


def test_no_probe_where_a_second_copy_of_the_model_would_not_fit(home, tiny, monkeypatch):
    """Under a tight memory limit the probe's child could get this process OOM-killed: no child, the
    file's layout for now, nothing saved (an unconstrained run decides later)."""
    from ondevice.machine.ram import RamBudget

    assert llama_repack.fits_twice(tiny)  # this machine, a tiny model
    monkeypatch.setattr(llama_repack, "ram_budget", lambda: RamBudget(llama_repack.PROBE_MARGIN, "a tight cgroup"))
    assert not llama_repack.fits_twice(tiny)
    assert not llama_repack.runs_here(tiny, LIBRARY, ["F32"])
    assert not (home / "machine").exists()
