"""The page-cache window of a streaming llama.cpp target (targets/page_cache.py): the same logits with
and without it, finished layers leave the page cache, kept layers and the next ones stay."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time

import numpy as np
import pytest

import tiny_models
from ondevice.targets.llama_target import LlamaTarget
from ondevice.targets.page_cache import LayerWindow, Span, _pieces, find_mapping, readahead_bytes
from ondevice.decode.tree import DraftTree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise/mincore steering is Linux-only")
N_LAYERS = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_models.write_layered_gguf(tmp_path_factory.mktemp("window") / "tiny.gguf", N_LAYERS)


def resident_fraction(spans) -> float:
    """Share of the spans' pages in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = cached = 0
    for span in spans:
        n = span.length // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * n)()
        assert libc.mincore(ctypes.c_void_p(span.start), ctypes.c_size_t(span.length), vec) == 0
        pages, cached = pages + n, cached + sum(v & 1 for v in vec)
    return cached / pages


def passes(target: LlamaTarget) -> list[np.ndarray]:
    tree = DraftTree(np.array([3, 50, 51, 60]), np.array([-1, 0, 0, 1]), np.zeros(4))
    target.prefill([5, 17, 42, 9])
    out = []
    for path in ([0, 1, 3], [0, 2]):
        out.append(target.forward_tree(tree))
        target.commit(path)
    return out


def test_the_window_changes_no_logit_and_steers_the_cache(tiny):
    plain = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True)
    reference = passes(plain)
    plain.close()  # pages mapped twice are shared, and the kernel pages out only unshared ones
    steered = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True, window=2, kept_layers=(0,))
    window = steered.window
    assert window is not None and find_mapping(tiny) is not None
    assert window.order == [*range(N_LAYERS), "output"]
    for expected, got in zip(reference, passes(steered)):
        assert np.array_equal(expected, got)
    window.drain()
    assert window.failed is None
    assert resident_fraction(window.layers[0]) > 0.9  # kept
    deadline = time.monotonic() + 5  # MADV_WILLNEED starts reads and returns: give them a moment
    while resident_fraction(window.layers[1]) < 0.9 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert resident_fraction(window.layers[1]) > 0.9  # the next pass's first streamed layer, prefetched
    finished = [resident_fraction(window.layers[i]) for i in range(2, N_LAYERS)]
    assert max(finished) < 0.5, finished  # paged out
    steered.close()
    steered.close()  # a second close (bench closes the engine, then the pipeline) does nothing
    assert window.fd is None and steered.window is None


def test_pieces_cover_a_span_exactly():
    span = Span(1 << 20, 10 * mmap.PAGESIZE + 123, 5 * mmap.PAGESIZE)
    pieces = _pieces(span, 4 * mmap.PAGESIZE)
    assert [p.length for p in pieces] == [4 * mmap.PAGESIZE, 4 * mmap.PAGESIZE, 2 * mmap.PAGESIZE + 123]
    assert all(b.start == a.start + a.length and b.offset == a.offset + a.length for a, b in zip(pieces, pieces[1:]))
    assert (pieces[0].start, pieces[0].offset) == (span.start, span.offset)


@pytest.fixture
def uncached_file(tmp_path):
    """(path, its mapping in this process, its size): random bytes, three readahead windows long,
    mapped and dropped from the page cache."""
    path = tmp_path / "layer.bin"
    size = 3 * readahead_bytes(tmp_path)
    with path.open("wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    try:
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
        mapping = find_mapping(path)
        if resident_fraction([Span(mapping[0], size, 0)]) > 0.1:
            pytest.skip("this file system keeps the file cached (tmpfs?): nothing to prefetch")
        yield path, mapped, mapping, size
    finally:
        mapped.close()
        os.close(fd)


def test_a_row_of_the_input_embeddings_is_read_alone(uncached_file):
    """The mapping is MADV_SEQUENTIAL, where a fault reads a whole readahead window (a third of this
    file); llama.cpp reads the input embeddings a row per token, so their span is MADV_RANDOM."""
    path, mapped, mapping, size = uncached_file
    rows = [Span(mapping[0], size, 0)]
    window = LayerWindow(path, mapping, {}, ahead=1, rows=rows)
    window.drain()
    assert mapped[size // 2] is not None  # one row looked up: a page fault in the middle
    assert resident_fraction(rows) < 0.02
    window.close()


def test_a_prefetched_layer_longer_than_one_readahead_is_read_whole(uncached_file):
    """One MADV_WILLNEED reads at most the device's readahead size; a layer three times that long
    must still be in the page cache after the window prefetches it (advised whole: a third)."""
    path, mapped, mapping, size = uncached_file
    layer = [Span(mapping[0], size, 0)]
    window = LayerWindow(path, mapping, {0: layer}, ahead=1)
    window.pass_starts()
    window.drain()
    deadline = time.monotonic() + 10  # MADV_WILLNEED starts reads and returns
    while resident_fraction(layer) < 0.95 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert resident_fraction(layer) > 0.95
    window.close()


def test_an_answers_time_split_adds_up_and_the_disk_busy_time_is_reported(tiny):
    """The engine's stats of a streaming target: draft / target compute / disk wait / overhead sum to
    the decoding time, the disk wait is the passes' own; the disk's busy time comes from the block device."""
    from ondevice.decode.engine import SpecEngine
    from ondevice.decode.stats import collect
    from ondevice.machine.disk_io import stat_file

    target = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True, window=1)
    engine = SpecEngine(target, None, is_end=lambda token: False)
    _, stats = collect(engine.generate([5, 17, 42, 9], max_tokens=6))
    split = stats.round_split()
    assert split["disk_wait"] is not None and 0 <= split["disk_wait"] <= stats.verify_seconds
    assert sum(split.values()) == pytest.approx(stats.decode_seconds, abs=1e-6)
    if stat_file(tiny) is not None:
        assert stats.disk_busy_seconds is not None and 0 <= stats.disk_utilization <= 1.05
    target.close()


def test_a_pass_splits_into_disk_wait_and_compute_that_add_up(tiny):
    target = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True, window=1, kept_layers=(0,))
    window = target.window
    splits = []
    pass_ends = window.pass_ends
    window.pass_ends = lambda: splits.append(pass_ends()) or splits[-1]
    target.prefill([5, 17, 42, 9])
    tree = DraftTree(np.array([3, 50, 51]), np.array([-1, 0, 1]), np.zeros(3))
    waited = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        target.forward_tree(tree)
        wall = time.perf_counter() - t0
        target.commit([0, 1])
        split = splits[-1]
        assert split is not None and split.layers == N_LAYERS + 1  # every decoder layer and the LM head reported
        assert 0 <= split.wait_seconds <= split.seconds <= wall
        assert split.wait_seconds + split.compute_seconds == pytest.approx(split.seconds)
        assert split.seconds > 0.5 * wall
        waited += split.wait_seconds
    assert target.stream_counters().page_wait_seconds == pytest.approx(waited)
    target.close()
