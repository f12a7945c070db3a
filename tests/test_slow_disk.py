"""The disk's read cap (ondevice.eval.slow_disk, `lowmem --read-bps`): a command in the cap's cgroup
reads no faster than the cap, direct reads and reads through the page cache alike, and the cgroup is
gone afterwards. Skipped where block-I/O cgroups are not writable (needs root) or the temporary
folder is not on a block device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ondevice.errors import OndeviceError
from ondevice.eval.slow_disk import ReadThrottle, whole_disk
from ondevice.machine import ram
from ondevice.machine.facts import drop_page_cache

MB = 10**6
CAP = 40 * MB
FILE = 96 * MB  # ~2.4 s at the cap; the disks here read it in well under a second

READ = """
import os, sys, time
direct = sys.argv[2] == "direct"
fd = os.open(sys.argv[1], os.O_RDONLY | (os.O_DIRECT if direct else 0))
buf = __import__("mmap").mmap(-1, 4 << 20)
t0 = time.perf_counter()
while os.readv(fd, [buf]) > 0:
    pass
print(time.perf_counter() - t0)
"""


def throttle_or_skip(path: Path) -> ReadThrottle:
    try:
        return ReadThrottle(whole_disk(path), CAP, name=f"ondevice-slowdisk-probe-{os.getpid()}")
    except (OndeviceError, OSError) as err:
        pytest.skip(f"the disk cannot be slowed down here: {err}")


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(FILE))
    os.sync()
    return path


@pytest.mark.parametrize("how", ["direct", "cached"])
def test_reads_in_the_throttle_take_as_long_as_the_cap_says(data, how):
    throttle = throttle_or_skip(data)
    try:
        assert throttle.held() == CAP
        drop_page_cache(data)
        seconds = float(subprocess.run([sys.executable, "-c", READ, str(data), how], preexec_fn=throttle.join,
                                       capture_output=True, text=True, check=True).stdout)
    finally:
        throttle.remove()
    assert seconds >= 0.6 * FILE / CAP  # the kernel lets a first slice through at once, never more
    assert not throttle.folder.exists()


def test_lowmem_read_bps_reports_the_cap_and_leaves_no_cgroup(data):
    throttle_or_skip(data).remove()
    parent, _ = ram.own_cgroup_folder("blkio")
    before = set(parent.glob("ondevice-slowdisk-*"))
    home = {**os.environ, "ONDEVICE_HOME": str(data.parent)}  # no models there: the cap is on the disk holding the home
    done = subprocess.run([sys.executable, "-m", "ondevice.eval.lowmem", "--read-bps", "40MB/s", "--",
                           sys.executable, "-c", READ, str(data), "direct"], capture_output=True, text=True, env=home)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["read_cap_held"] and report["read_bps"] == CAP, report
    assert float(done.stdout) >= 0.6 * FILE / CAP, report
    assert set(parent.glob("ondevice-slowdisk-*")) == before


def test_a_file_off_any_block_device_is_refused_in_one_line():
    with pytest.raises(OndeviceError, match="not on a block device"):
        whole_disk(Path("/proc/self/status"))
