"""targets/direct_window.py: a streaming target's layers read with O_DIRECT into reused slots. The
logits equal the target's without a window (also with a slow disk, and when reads fail and the file is
mapped back); the reader never runs more slots ahead of llama.cpp than the memory plan's room."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

import tiny_models
from ondevice.files.gguf_header import OUTPUT_LAYER
from ondevice.machine.ram import peak_rss
from ondevice.targets import direct_window
from ondevice.targets.direct_window import DirectWindow, direct_reads_work
from ondevice.targets.llama_target import LlamaTarget
from ondevice.decode.tree import DraftTree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT, memfd and MAP_FIXED are Linux-only")
N_LAYERS = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_models.write_layered_gguf(tmp_path_factory.mktemp("direct") / "tiny.gguf", N_LAYERS)
    if not direct_reads_work(path):
        pytest.skip("this file system does not take O_DIRECT reads")
    return path


def answers(target: LlamaTarget) -> list[np.ndarray]:
    tree = DraftTree(np.array([3, 50, 51, 60]), np.array([-1, 0, 0, 1]), np.zeros(4))
    target.prefill([5, 17, 42, 9, 11, 23])
    out = []
    for path in ([0, 1, 3], [0, 2], [0], [0, 1]):
        out.append(target.forward_tree(tree))
        target.commit(path)
    return out


KEPT_SETS = [(OUTPUT_LAYER, 0), (OUTPUT_LAYER, 2, 4)]  # kept first; spread through the pass (plan.memory.spread_layers)


def streamed(path, kept=KEPT_SETS[0], window=1, **kw) -> LlamaTarget:
    return LlamaTarget(path, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True, window=window,
                       kept_layers=kept, **kw)


@pytest.fixture(scope="module")
def reference(tiny):
    plain = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True)
    out = answers(plain)
    plain.close()
    return out


@pytest.mark.parametrize("kept", KEPT_SETS)
def test_the_same_logits_as_without_a_window(tiny, reference, kept):
    target = streamed(tiny, kept)
    assert isinstance(target.window, DirectWindow)
    for expected, got in zip(reference, answers(target)):
        assert np.array_equal(expected, got)
    assert target.window.failed is None
    assert target.stream_counters().page_wait_seconds >= 0
    target.close()
    target.close()


@pytest.mark.parametrize("kept", KEPT_SETS)
@pytest.mark.parametrize("window", [1, 2])  # 2, 3 or 4 streamed layers in 2 or 3 slots: a pass's end wraps mid-cycle
def test_llama_cpp_waits_for_a_slow_disk(tiny, reference, monkeypatch, kept, window):
    """Reads that take long: llama.cpp must wait for each layer (stale slot contents would change the logits)."""
    read = DirectWindow._read_piece
    monkeypatch.setattr(DirectWindow, "_read_piece", lambda self, piece: (time.sleep(0.02), read(self, piece))[1])
    target = streamed(tiny, kept, window)
    for expected, got in zip(reference, answers(target)):
        assert np.array_equal(expected, got)
    assert target.stream_counters().page_wait_seconds > 0.02  # it did wait
    target.close()


def test_a_failed_read_maps_the_file_back(tiny, reference, monkeypatch):
    read, calls = DirectWindow._read_piece, []

    def failing(self, piece):
        calls.append(piece)
        if len(calls) == 7:
            raise OSError("injected read error")
        read(self, piece)

    monkeypatch.setattr(DirectWindow, "_read_piece", failing)
    target = streamed(tiny)
    for expected, got in zip(reference, answers(target)):
        assert np.array_equal(expected, got)
    assert target.window.failed is not None and "injected" in target.window.failed
    target.close()


def test_the_reader_stays_within_its_slots(tiny, monkeypatch):
    """Logged as the reader starts each read: never more positions than slots between llama.cpp's
    progress and the read (the layer computing included), and the slots' memory is the room the
    memory plan leaves for layers in flight, (ahead + 1) × the largest layer."""
    log = []
    start = DirectWindow._start

    def logged(self, position):
        log.append((self.consumed, position, self.n_slots))
        return start(self, position)

    monkeypatch.setattr(DirectWindow, "_start", logged)
    target = streamed(tiny)
    answers(target)
    window = target.window
    window.drain()
    largest = max(sum(s.length for s in spans) for spans in window.own.values())
    assert os.fstat(window.memfd).st_size == window.n_slots * largest == 2 * largest  # window=1: ahead + 1 slots
    assert len(log) > 3 * len(window.streamed)  # every streamed layer read, pass after pass
    for consumed, position, slots in log:
        assert consumed <= position < consumed + slots, (consumed, position)
    target.close()


def test_each_layer_is_mapped_over_its_slot_once(tiny, monkeypatch):
    """The slots' mappings stay from pass to pass (remapped for every read, the page tables were
    rebuilt by a minor fault per page: 137,510 faults and ~150 ms of system time per pass of the
    default pair), and two layers in one slot at once would be a read over a layer computing."""
    mapped = []
    map_over = DirectWindow._map_over
    monkeypatch.setattr(DirectWindow, "_map_over", lambda self, span, fd, at: (mapped.append(span), map_over(self, span, fd, at))[1])
    target = streamed(tiny, window=2)
    answers(target)
    window = target.window
    spans = [s for layer in window.streamed for s in window.own[layer]]
    assert sorted(mapped, key=lambda s: s.start) == sorted(spans, key=lambda s: s.start)
    slots = [window._slot(p) for p in range(len(window.streamed))]
    assert set(slots) == set(range(min(window.n_slots, len(window.streamed))))
    target.close()


def shmem_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssShmem in /proc/self/status")


def test_peak_rss_counts_the_slots_once(tiny):
    """Every streamed layer shows its slot's pages at its own addresses, and the kernel counts each
    mapping: its shared-memory count grows by all the layers read, the slots hold far less, and
    the peak RSS ondevice reports takes off exactly the difference."""
    before = shmem_bytes()
    target = streamed(tiny, kept=(OUTPUT_LAYER,))  # every decoder layer streams through 2 slots
    answers(target)
    window = target.window
    window.drain()
    assert window.read_layers == set(window.streamed)
    mapped = sum(span.length for layer in window.streamed for span in window.own[layer])
    grown = shmem_bytes() - before
    assert mapped - window.bound <= grown <= mapped  # the kernel counts every layer's mapping, not the slots' memory once
    assert target.rss_counted_twice == mapped - window.bound > 0
    assert abs(peak_rss(target.rss_counted_twice) - (peak_rss() - target.rss_counted_twice)) < 1 << 20  # the high-water mark may move between the calls
    target.close()


def test_the_page_cache_window_where_the_head_streams(tiny):
    target = LlamaTarget(tiny, n_ctx=128, threads=1, max_tree_nodes=16, n_ubatch=64, streams=True, window=1, kept_layers=(0,))
    assert not isinstance(target.window, DirectWindow)  # slots are sized for decoder layers: the head streams through the page cache
    target.close()


def test_no_direct_window_where_o_direct_is_refused(tiny, monkeypatch):
    monkeypatch.setattr(direct_window, "direct_reads_work", lambda path: False)
    target = streamed(tiny)
    assert target.window is not None and not isinstance(target.window, DirectWindow)
    target.close()
