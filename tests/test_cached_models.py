"""How a cached model file is checked before use (ondevice/catalog/verified.py), and the download
folder's checks (models_folder.py).

The `fake` pair of test_hub.py: a local PEP 691 index serving the pair as byte-sliced wheels, so a
file found bad is downloaded again for real.
"""

from __future__ import annotations

import json
import os
import sys

from ondevice.catalog import hub, verified
from sandbox_fs import run_in_home
from test_hub import FakeModels, closed_port_url, fake, quiet_console  # noqa: F401 (fake is a fixture)


def flip_byte(path, offset: int) -> None:
    """Change one byte in place and set the mtime back, as `touch -d` or `cp -p` would."""
    stat = path.stat()
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_size == stat.st_size


def test_a_flipped_byte_with_its_mtime_restored_is_caught(fake):
    path = hub.ensure_pair(fake.pair(), quiet_console()[0]).target
    flip_byte(path, 1000)
    console, text = quiet_console()
    assert hub.ensure_pair(fake.pair(), console).target.read_bytes() == fake.target  # downloaded again
    assert "the cached file is bad" in text.getvalue()


def test_the_ctime_catches_a_byte_outside_the_sampled_blocks(fake, monkeypatch):
    monkeypatch.setattr(verified, "SAMPLE_BLOCKS", 2)
    monkeypatch.setattr(verified, "SAMPLE_BYTES", 4096)
    path = hub.ensure_pair(fake.pair(), quiet_console()[0]).target
    middle = len(fake.target) // 2
    assert all(not o <= middle < o + 4096 for o in verified.sample_offsets(len(fake.target)))
    flip_byte(path, middle)
    console, text = quiet_console()
    assert hub.ensure_pair(fake.pair(), console).target.read_bytes() == fake.target
    assert "the cached file is bad" in text.getvalue()


def test_the_sample_catches_a_change_the_stat_does_not_show(fake):
    """A change below the filesystem keeps size, mtime, ctime and inode: the sampled hash sees it."""
    path = hub.ensure_pair(fake.pair(), quiet_console()[0]).target
    flip_byte(path, 10)
    marker = verified.marker_path(path)
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({**record, **verified.file_state(path.stat())}))  # as if the stat had not moved
    console, text = quiet_console()
    assert hub.ensure_pair(fake.pair(), console).target.read_bytes() == fake.target
    assert "changed since they were verified" in text.getvalue() and "the cached file is bad" in text.getvalue()


def test_an_unchanged_file_is_not_hashed_and_an_old_marker_once(fake, monkeypatch):
    path = hub.ensure_pair(fake.pair(), quiet_console()[0]).target
    marker = verified.marker_path(path)
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({k: record[k] for k in ("sha256", "size", "mtime_ns", "source")}))  # before ctime and sample
    hashed, verify_file = [], hub.verify_file
    monkeypatch.setattr(hub, "verify_file", lambda p, *args: (hashed.append(p.name), verify_file(p, *args)))
    for _ in range(3):
        hub.ensure_pair(fake.pair(), quiet_console()[0])
    assert hashed == ["fake-target.gguf"]  # once, for the old marker; then its sample is enough
    assert json.loads(marker.read_text())["sample"] == verified.sampled_digest(path)


def test_the_sample_is_a_few_blocks_first_and_last_included():
    size = 40 << 30
    offsets = verified.sample_offsets(size)
    assert len(offsets) == verified.SAMPLE_BLOCKS and offsets[0] == 0 and offsets[-1] == size - verified.SAMPLE_BYTES
    assert verified.sample_offsets(100_000) == list(range(0, 100_000, verified.SAMPLE_BYTES))  # a small file: all of it


def download_in(fake: FakeModels, tmp_path, mode: str, size: str):
    return run_in_home(fake.home, [sys.executable, "-m", "ondevice", "download", "fake"], mode, tmp_path / "out", size=size,
                       env={"ONDEVICE_PYPI_INDEX": f"{fake.index.url}/simple", "HF_ENDPOINT": closed_port_url()})


def test_a_small_pair_downloads_into_a_small_disk(fake, tmp_path):
    """300 kB of models on a 4 MB filesystem: the margin is sized to the download, not 256 MB."""
    run = download_in(fake, tmp_path, "rw", "4m")
    assert run.rc == 0 and "success" in run.stderr, run.stderr
    too_small = download_in(fake, tmp_path / "again", "rw", "400k")
    assert too_small.rc == 1 and "not enough disk space" in too_small.stderr and "Traceback" not in too_small.stderr


def test_downloading_into_a_read_only_home_is_one_line(fake, tmp_path):
    run = download_in(fake, tmp_path, "ro", "4m")
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.rc == 1 and len(lines) == 1 and "cannot download into" in lines[0] and "ONDEVICE_HOME" in lines[0], run.stderr
