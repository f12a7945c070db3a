"""The low-RAM emulation (ondevice.eval.lowmem): a command in a memory cgroup of its own sees the
limit as its RAM budget and cannot exceed it; the balloon is checked alive after the run.

Nothing here can hurt other processes: the cgroup limits only the child it runs (skipped where
cgroups are not writable), and the balloon locks 16 MiB."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ondevice.errors import OndeviceError
from ondevice.eval import lowmem
from ondevice.machine.ram import own_cgroup_folder

MiB = 1 << 20


def cgroups_writable() -> bool:
    try:
        lowmem.MemoryCgroup(256 * MiB, name="ondevice-lowmem-probe").remove()
        return True
    except (OndeviceError, OSError):
        return False


needs_cgroup = pytest.mark.skipif(not cgroups_writable(), reason="memory cgroups are not writable here (needs root)")

REPORT_BUDGET = "from ondevice.machine.ram import ram_budget; import json; b = ram_budget(); print(json.dumps([b.bytes, b.source]))"


@needs_cgroup
def test_a_command_in_the_cgroup_sees_the_limit_as_its_budget(tmp_path):
    limit = 300 * MiB
    out = tmp_path / "budget.json"
    folder, _ = own_cgroup_folder()
    before = set(folder.glob("ondevice-lowmem-*"))  # a run killed with SIGKILL leaves its cgroup: not this test's
    rc, report = lowmem.run_in_cgroup([sys.executable, "-c", REPORT_BUDGET], limit, drop=[])
    assert rc == 0 and report["limit_held"] and report["cold_start"]
    done = subprocess.run([sys.executable, "-m", "ondevice.eval.lowmem", "--cgroup", "300MiB", "--report", str(out), "--",
                           sys.executable, "-c", REPORT_BUDGET], capture_output=True, text=True)
    budget, source = json.loads(done.stdout)
    assert source.startswith("cgroup limit") and 0 < budget <= limit
    assert json.loads(out.read_text())["peak_usage_bytes"] <= limit
    assert set(folder.glob("ondevice-lowmem-*")) == before  # removed afterwards


@needs_cgroup
def test_a_command_that_outgrows_the_limit_is_stopped_and_reported():
    grow = "import numpy as np; a = np.ones(400 * 2**20 // 8); print('survived')"
    rc, report = lowmem.run_in_cgroup([sys.executable, "-c", grow], 200 * MiB, drop=[])
    assert rc != 0 and report["oom_kills"] >= 1 and report["peak_usage_bytes"] <= 200 * MiB


def test_the_page_cache_of_a_file_is_measured(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(8 * MiB))
    path.read_bytes()
    assert lowmem.cached_bytes(path) == 8 * MiB  # just written and read: all cached
    lowmem.drop_page_cache(path)
    if lowmem.cached_bytes(path) == 8 * MiB:
        pytest.skip("this file system keeps files in memory (tmpfs): nothing to drop")
    assert lowmem.cached_bytes(path) < MiB


def test_balloon_alive_means_the_run_counts():
    rc, report = lowmem.run_with_balloon([sys.executable, "-c", "print('ran')"], 16 * MiB, timeout_s=60)
    assert rc == 0 and report["balloon_alive"] and report["limit_held"]


def test_a_dead_balloon_discards_the_run():
    kill = "import os, signal; os.kill(int(os.environ['ONDEVICE_BALLOON_PID']), signal.SIGKILL)"
    rc, report = lowmem.run_with_balloon([sys.executable, "-c", kill], 16 * MiB, timeout_s=60)
    assert rc == lowmem.NOT_CONSTRAINED and not report["balloon_alive"] and not report["limit_held"]


def test_the_balloon_lets_go_by_itself():
    balloon = lowmem.start_balloon(16 * MiB, timeout_s=1)
    assert balloon.wait(timeout=30) == 0


def test_a_model_file_the_command_names_outside_the_home_leaves_the_page_cache_too(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "models").mkdir(parents=True)
    kept = tmp_path / "home" / "models" / "a.gguf"
    own = tmp_path / "mine" / "b.gguf"
    own.parent.mkdir()
    kept.write_bytes(b"GGUF")
    own.write_bytes(b"GGUF")
    command = ["ondevice", "bench", "--target", str(own), f"--drafter={kept}", "--out", str(tmp_path / "x.json")]
    assert lowmem.model_files(command) == [kept, own]  # each once; a path that is no GGUF file is not one
    assert lowmem.model_files() == [kept]
