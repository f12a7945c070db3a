"""A streaming llama.cpp target shares its memory limit with this process's heap: blocks the heap
frees must go back to the system (machine/ram.py, unmap_large_frees), or the page cache gives up
the target's kept layers for them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_models

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc, /proc/self/status")

# what a round does: a tree's logits (16 nodes x 151936), a float64 copy, small objects kept between them
PATTERN = """
import numpy as np
def anon():
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("RssAnon:"))
base, keep = anon(), []
for _ in range(20):
    logits = np.ones((16, 151936), np.float32)
    wide = logits.astype(np.float64)
    keep.append(np.ones(1000))
    del logits, wide
print("RETAINED", anon() - base)
"""


def retained(setup: str) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    run = subprocess.run([sys.executable, "-c", setup + PATTERN], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return int(run.stdout.split("RETAINED")[-1])


def test_after_a_streaming_target_loads_freed_logits_leave_the_process(tmp_path):
    model = tiny_models.write_layered_gguf(tmp_path / "tiny.gguf", 4)
    load = f"from ondevice.pipeline import load\npipe = load(target={str(model)!r}, ram_memory='1MB')\nassert pipe.backends.memory.streams\n"
    assert retained(load) < 2 << 20  # without the fixed threshold: ~29 MB here


def test_a_target_in_ram_leaves_glibc_as_it_is(tmp_path):
    """The reference the test above is measured against: glibc's own behaviour keeps freed logits."""
    model = tiny_models.write_layered_gguf(tmp_path / "tiny.gguf", 4)
    load = f"from ondevice.pipeline import load\npipe = load(target={str(model)!r})\nassert not pipe.backends.memory.streams\n"
    assert retained(load) > 8 << 20
