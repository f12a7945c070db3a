"""State is a cache, never a reason not to answer.

A tiny pair in a temp ONDEVICE_HOME; the real CLI in a subprocess. A state file of the wrong shape is
named in one warning line, kept until the next save replaces it; one that is not a regular file (a
FIFO, a link to /dev/zero) or too large is not read; a read-only or full home (a real tmpfs,
tests/sandbox_fs.py) gives one warning line and the answer, and leaves no `*.tmp` or empty file
behind. Two processes writing and reading one state file at once: every read is a whole record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ondevice import paths
from ondevice.bench.measured import load_measured, measured_path, record_bench
from ondevice.paths import read_state, write_json
from ondevice.plan.acceptance import AcceptanceTracker, acceptance_dir
from ondevice.plan.fallback import LookupTracker
from sandbox_fs import run_in_home
from tiny_models import write_tiny_pair

GENERATE = ["generate", "hello there", "-m", "tiny", "--threads", "1", "--ctx", "512", "-n", "16", "--json"]
BENCH = ["bench", "-m", "tiny", "--threads", "1", "--limit", "1", "--max-tokens", "8", "--trees", "chain", "--budgets", "2", "--json"]


def ondevice(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ondevice", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ONDEVICE_HOME": str(home)})


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


@pytest.fixture(scope="module")
def used_home(tmp_path_factory) -> tuple[Path, list[int]]:
    """A home where the tiny pair has run once (profile, acceptance records, .verified markers written),
    and that run's token ids."""
    home = tmp_path_factory.mktemp("home")
    write_tiny_pair(home, arch="llama", head_scale=3.0)
    result = ondevice(home, *GENERATE)
    assert result.returncode == 0, result.stderr
    return home, json.loads(result.stdout)["token_ids"]


def test_state_files_of_the_wrong_shape_are_replaced_naming_them(used_home, tmp_path):
    """Acceptance, lookup and planner records holding [1,2,3]: one warning naming each, the same answer,
    and each file saved again in its own shape. (generate measures no profile: test_profile_of_the_wrong_shape.)"""
    source, reference = used_home
    home = tmp_path / "home"
    shutil.copytree(source, home)
    state = sorted((home / "acceptance").glob("*.json")) + sorted((home / "arms").glob("*.json"))
    assert len(state) == 6, state  # acceptance by rank, builders' gains, lookup, suffix, recycle; the planner's book
    for path in state:
        path.write_text("[1,2,3]")
    result = ondevice(home, *GENERATE)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["token_ids"] == reference
    lines = warnings(result.stderr)
    for path in state:
        assert sum(str(path) in line for line in lines) == 1, result.stderr
        assert isinstance(json.loads(path.read_text()), dict), path  # replaced by this run's own record


def test_acceptance_arrays_of_the_wrong_length_are_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    path = acceptance_dir() / "p.json"
    write_json(path, {"prior": [0.5, 0.2, 0.1], "prior_weight": 50, "decay": 0.99, "accepted": [1, 2], "at_risk": [3, 4, 5]})
    tracker = AcceptanceTracker.load("p")
    assert tracker.p_rank.shape == AcceptanceTracker().p_rank.shape  # the default prior
    assert str(path) in capsys.readouterr().err and path.exists()  # kept until a save replaces it
    tracker.save("p")
    assert AcceptanceTracker.load("p").p_rank.tolist() == tracker.p_rank.tolist() and capsys.readouterr().err == ""


@pytest.mark.parametrize("content", ["[1,2,3]", '{"share_prior": "x"}', '{"share_prior": NaN}', "{", '"just a string"'])
def test_lookup_record_of_the_wrong_shape_is_replaced(tmp_path, monkeypatch, capsys, content):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    path = acceptance_dir() / "p-lookup.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert LookupTracker.load("p").share == LookupTracker().share
    assert str(path) in capsys.readouterr().err and path.read_text() == content  # never removed on a failed read


@pytest.mark.parametrize("content", ["[1,2,3]", '{"format": 4, "pair": "p"}'])
def test_profile_of_the_wrong_shape_is_replaced(used_home, tmp_path, monkeypatch, capsys, content):
    """A profile (measured by `ondevice profile` or a chat) holding the wrong shape: one warning naming
    it, and the planner goes on without one (the file stays until a new profile replaces it)."""
    from ondevice.loading.choices import load_backends
    from ondevice.loading.options import LoadOptions
    from ondevice.plan.profile import profile_path, saved_profile
    from ondevice.machine.facts import machine_facts

    home = tmp_path / "home"
    shutil.copytree(used_home[0], home)
    monkeypatch.setenv("ONDEVICE_HOME", str(home))
    backends = load_backends(LoadOptions(model="tiny", threads=1, ctx=512))
    path = profile_path(machine_facts().fingerprint(), "tiny", backends.profile_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    assert saved_profile(backends) is None
    assert str(path) in capsys.readouterr().err and path.read_text() == content


def test_bench_record_of_the_wrong_shape_is_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    path = measured_path("fp", "p", "llama")
    path.parent.mkdir(parents=True)
    path.write_text("[1,2,3]")
    assert load_measured("fp", "p", "llama") == {}
    assert str(path) in capsys.readouterr().err
    record_bench("fp", "p", "llama", [])
    assert json.loads(path.read_text()) == {}


def test_unreadable_state_is_none_and_a_missing_file_is_silent(tmp_path, capsys):
    assert read_state(tmp_path / "none.json", dict, "record") is None
    assert capsys.readouterr().err == ""
    (tmp_path / "dir.json").mkdir()  # reading a folder fails with an OSError
    assert read_state(tmp_path / "dir.json", dict, "record") is None
    assert "dir.json" in capsys.readouterr().err
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert read_state(tmp_path / "deep.json", list, "record") is None
    assert "deep.json" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["ro", "full"])
def test_read_only_or_full_home_warns_once_and_answers(used_home, tmp_path, mode):
    """The markers, profile and acceptance records cannot be written: one warning line, the same answer."""
    source, reference = used_home
    for marker in (source / "models").glob("*.verified"):  # stale markers: the run rehashes and tries to write them
        marker.unlink()
    for folder in ("profiles", "acceptance"):
        shutil.rmtree(source / folder, ignore_errors=True)
    run = run_in_home(source, [sys.executable, "-m", "ondevice", *GENERATE], mode, tmp_path / "out")
    assert run.rc == 0 and "Traceback" not in run.stderr, run.stderr
    assert json.loads(run.stdout)["token_ids"] == reference
    reason = "Read-only file system" if mode == "ro" else "No space left on device"
    assert len(warnings(run.stderr)) == 1 and reason in run.stderr, run.stderr
    assert run.leftovers == []


def test_full_home_bench_answers_and_leaves_no_tmp(used_home, tmp_path):
    source, _ = used_home
    run = run_in_home(source, [sys.executable, "-m", "ondevice", *BENCH], "full", tmp_path / "out")
    assert run.rc == 0 and "Traceback" not in run.stderr, run.stderr
    assert "No space left on device" in run.stderr
    rows = json.loads(run.stdout)["results"]
    assert [(row["config"], row["error"]) for row in rows] == [("target only", None), ("chain @2", None)]
    assert run.leftovers == []


# --- state files that are not files, too large, or written by two processes at once -------------------


def test_state_files_that_are_fifos_neither_hang_nor_stop_the_answer(used_home, tmp_path):
    """Every state file replaced by a FIFO (nobody writes to it: reading one used to block forever):
    one warning per file, the same answer, and each saved again as a regular file."""
    source, reference = used_home
    home = tmp_path / "home"
    shutil.copytree(source, home)
    assert ondevice(home, *GENERATE).returncode == 0  # every state file there (another test may have removed some)
    state = sorted((home / "acceptance").glob("*.json")) + sorted((home / "arms").glob("*.json")) + sorted((home / "models").glob("*.verified"))
    assert len(state) >= 8, state
    for path in state:
        path.unlink()
        os.mkfifo(path)
    started = time.monotonic()
    result = ondevice(home, *GENERATE)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["token_ids"] == reference and time.monotonic() - started < 120
    lines = warnings(result.stderr)
    for path in state:
        assert sum(str(path) in line and "not a regular file" in line for line in lines) == 1, result.stderr
        assert path.is_file(), path  # replaced by this run's own record


ENDLESS = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # reading without bound ends here, not in the machine's memory
from ondevice.paths import read_state, write_json
path = sys.argv[1]
started = time.monotonic()
assert read_state(path, dict, "record") is None
assert time.monotonic() - started < 1
assert str(write_json(path, {"a": 1})) == path and read_state(path, dict, "record") == {"a": 1}
"""


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_state_file_linked_to_an_endless_device_is_not_read(tmp_path, device):
    """Read in a process of its own under a 1 GiB limit (the link was read without bound: MemoryError):
    one warning, nothing read, and a save replaces the link, not the device."""
    path = tmp_path / "record.json"
    path.symlink_to(device)
    result = subprocess.run([sys.executable, "-c", ENDLESS, str(path)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr
    assert warnings(result.stderr) == [f"warning: cannot read the record {path} (not a regular file); going on without it"]
    assert path.is_file() and not path.is_symlink()


def test_state_file_larger_than_the_limit_is_not_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(paths, "MAX_STATE_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    assert read_state(path, dict, "record") is None
    assert f"{path.stat().st_size:,} bytes, more than 1,000" in capsys.readouterr().err and path.exists()


def test_two_processes_writing_and_reading_one_state_file(tmp_path):
    """Two processes each save 500 records of many sizes to one file and read it back after each save
    (1,000 writes, 1,000 reads): every read is a whole record of one of them, nothing warns, the file
    is never missing, and no temporary file is left. (With one shared NAME.tmp, 184 of 4,000 reads
    saw invalid JSON, and a read that failed removed the file.)"""
    path = tmp_path / "shared.json"
    write_json(path, {"writer": "a", "i": -1, "length": 1, "pad": "a"})
    child = [sys.executable, str(Path(__file__).parent / "state_child.py"), str(path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([*child, writer, "500"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for writer in "ab"]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0 and err == "", err
        counts = json.loads(out)
        assert counts == {"writes": 500, "reads": 500, "invalid": 0, "missing": 0}, counts
    assert path.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["shared.json"]
