"""A real read-only or full ONDEVICE_HOME for tests: a small tmpfs in a private mount namespace.

`unshare --user --map-root-user --mount` gives the command its own mounts (no root needed where user
namespaces are allowed; nothing outside the namespace sees the tmpfs), so a write there fails the
way it does on a user's machine: EROFS on a read-only home, ENOSPC on a full one.

    result = run_in_home(source_home, ["python", "-m", "ondevice", ...], mode="full", out=tmp_path / "out")
    result.rc, result.stdout, result.stderr, result.leftovers   # leftovers: *.tmp and empty files left in the home
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = r"""
set -e
mount -t tmpfs -o size="$SIZE" tmpfs "$HOME_MP"
cp -a "$SOURCE/." "$HOME_MP/"
case "$MODE" in
  ro) mount -o remount,ro "$HOME_MP" ;;
  full) dd if=/dev/zero of="$HOME_MP/.filler" bs=4096 2>/dev/null || true ;;
esac
set +e
"$@" >"$OUT/stdout" 2>"$OUT/stderr"
echo $? >"$OUT/rc"
find "$HOME_MP" -type f \( -name '*.tmp' -o -size 0 \) ! -name .filler >"$OUT/leftovers"
"""


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    leftovers: list[str]


@functools.cache
def namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as mp:
        probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f"mount -t tmpfs tmpfs {mp}"],
                               capture_output=True, timeout=30)
    return probe.returncode == 0


def run_in_home(source: Path, command: list[str], mode: str, out: Path, env: dict[str, str] | None = None,
                size: str = "8m", timeout: float = 300) -> Run:
    """Run `command` with ONDEVICE_HOME a tmpfs of `size` holding a copy of `source`: mode "ro" (mounted
    read-only), "full" (filled to the last block first) or "rw" (as it is)."""
    if not namespaces_work():
        pytest.skip("needs `unshare --user --mount` (user and mount namespaces) for a real read-only or full filesystem")
    out.mkdir(parents=True, exist_ok=True)
    mountpoint = out / "home"
    mountpoint.mkdir(exist_ok=True)
    variables = {"SIZE": size, "HOME_MP": str(mountpoint), "SOURCE": str(source), "MODE": mode, "OUT": str(out)}
    full_env = {**os.environ, **(env or {}), **variables, "ONDEVICE_HOME": str(mountpoint)}
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", SCRIPT, "sh", *command],
                   env=full_env, timeout=timeout, check=True)
    leftovers = [line for line in (out / "leftovers").read_text().splitlines() if line]
    return Run(int((out / "rc").read_text()), (out / "stdout").read_text(), (out / "stderr").read_text(), leftovers)
