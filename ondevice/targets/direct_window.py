"""A streaming llama.cpp target's layers read with O_DIRECT into a few reused slots, not through the page cache.

Reading through the page cache costs the CPU that computes (page allocation, LRU and cgroup
accounting, reclaim, mapping faults), and one stream of page-cache reads moves less than several
O_DIRECT reads at once (docs/measurements/code-notes.md, "Direct reads"). So, where the LM head is
kept in RAM:

- `slots`: a memfd of `ahead` + 1 slots, each the size of the largest streamed layer. Its pages are
  allocated once and reused: freeing and faulting fresh pages for every layer cost as much as the
  page cache did (docs/measurements/code-notes.md, "Direct-read slots");
- each streamed layer has a slot of its own place (its index among the streamed layers, modulo the
  slots), mapped once over the pages only that layer's tensors occupy (mmap MAP_FIXED; pages a layer
  shares with a neighbour stay mapped from the file): the mappings and their page tables stay, so a
  read fills them without a fault (remapped before every read, the faults cost system time and
  slowed the compute beside them);
- a reader thread reads the next streamed layers (in the order llama.cpp computes them, round and
  round) into their slots with O_DIRECT, READERS reads of CHUNK bytes at a time, each as soon as its
  slot is free: once llama.cpp has finished the layer before it there. The layers sharing a slot
  all show what was read last, so
- llama.cpp must never compute a streamed layer before its read ends: the eval callback of the layer
  before (and `before_decode`, before each llama_decode) blocks until it has; that blocking is the
  pass's disk wait, timed exactly.

Kept layers are read once into the page cache and stay there, MADV_NORMAL: the kernel may take some
back near the memory limit (memory of our own it could not: the process gets OOM-killed,
docs/measurements/code-notes.md), and they then come back in reads around the fault
(under MADV_RANDOM a page per fault; under MADV_SEQUENTIAL
their use does not count as a reference and they were reclaimed first). The rest of the mapping (pages
a layer shares with a neighbour, the input embeddings) is MADV_RANDOM: a fault reads its page only.
A read that fails maps every streamed layer from the file again (the page cache serves them, as
without a window) before llama.cpp goes on.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from ondevice.files.gguf_header import OUTPUT_LAYER
from ondevice.targets.pass_split import PassSplit
from ondevice.targets.page_cache import (MADV_RANDOM, MADV_SEQUENTIAL, MADV_WILLNEED, MAP_FIXED, PAGE, LayerWindow, Span, _pieces, advise, layer_spans,
                                        mapped_layers, mapping_libc, readahead_bytes)

READERS = 4  # O_DIRECT reads in flight at once: four move more than one (docs/measurements/code-notes.md, "Reads in flight")
CHUNK = 4 << 20  # bytes per read
MADV_NORMAL, MADV_POPULATE_READ = 0, 22  # the latter: Linux 5.14+
MERGE_GAP = 64  # tensors of one layer this close (GGUF alignment padding) are one stretch of the file


def open_window(path: str | Path, ahead: int, kept: Iterable = ()):
    """The direct-read window over llama.cpp's mapping of `path` where it can work (Linux, O_DIRECT
    on this file system, the LM head kept), else the page-cache window (page_cache.LayerWindow),
    else None (the file is not mapped)."""
    kept = set(kept)
    found = mapped_layers(path)
    if found is None:
        return None
    mapping, tensors, rows = found
    layers = layer_spans(mapping, tensors)
    if OUTPUT_LAYER in kept and direct_reads_work(path):
        order = sorted(k for k in layers if k != OUTPUT_LAYER) + [OUTPUT_LAYER]
        own = {key: own_pages(mapping, tensors[key]) for key in order}
        streamed = {k: v for k, v in own.items() if v and k not in kept}
        if streamed:
            return DirectWindow(path, mapping, order, streamed, [s for k in order if k in kept for s in layers.get(k, [])], ahead)
    return LayerWindow(path, mapping, layers, ahead, kept, [rows] if rows else [])


def direct_reads_work(path: str | Path) -> bool:
    """Whether `path` can be read with O_DIRECT into page-aligned memory (one page, at offset 0)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except (OSError, AttributeError):
        return False
    buf = mmap.mmap(-1, PAGE)
    try:
        return os.preadv(fd, [buf], 0) > 0
    except OSError:
        return False
    finally:
        buf.close()
        os.close(fd)


def own_pages(mapping: tuple[int, int, int], tensors) -> list[Span]:
    """The whole pages of the mapping that hold only these tensors' bytes (their stretches of the
    file merged across alignment padding, then shrunk to whole pages)."""
    stretches: list[list[int]] = []
    for t in sorted(tensors, key=lambda t: t.offset):
        if stretches and t.offset - stretches[-1][1] <= MERGE_GAP:
            stretches[-1][1] = max(stretches[-1][1], t.offset + t.nbytes)
        else:
            stretches.append([t.offset, t.offset + t.nbytes])
    start, end, file_offset = mapping
    spans = []
    for lo, hi in stretches:
        lo, hi = max(-(-lo // PAGE) * PAGE, file_offset), min(hi // PAGE * PAGE, file_offset + end - start)
        if hi > lo:
            spans.append(Span(start + lo - file_offset, hi - lo, lo))
    return spans


class DirectWindow:
    def __init__(self, path, mapping: tuple[int, int, int], order: list, own: dict, kept: list[Span], ahead: int):
        self.order = order  # every layer in compute order, the LM head last
        self.own = own  # streamed layer → the pages only its tensors occupy
        self.streamed = [k for k in order if k in own]  # streamed position p is layer streamed[p % len]
        self.slot_bytes = max(sum(s.length for s in spans) for spans in own.values())
        self.n_slots = max(1, ahead + 1)  # the memory plan's room for layers in flight: ahead + 1 of the largest
        self.bound = self.n_slots * self.slot_bytes
        self.memfd = os.memfd_create("ondevice-layers")
        os.ftruncate(self.memfd, self.bound)
        self.kept = kept  # the kept layers' pages: read once into the page cache, left there
        self.kept_ready = threading.Event()
        self.advice_chunk = readahead_bytes(path) // PAGE * PAGE  # what one MADV_WILLNEED reads at most
        self.direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        self.file_fd = os.open(path, os.O_RDONLY)
        self.libc = mapping_libc()
        self.pool = ThreadPoolExecutor(READERS, thread_name_prefix="ondevice-direct-read")
        self.cond = threading.Condition()
        self.consumed = 0  # streamed positions llama.cpp has finished
        self.next_read = 0  # the next streamed position to give a slot
        self.slot_of: dict[int, int] = {}  # streamed position → its slot, while read or computed
        self.filled: set[int] = set()  # streamed positions read
        self.failed: str | None = None  # a read failed: every streamed layer is mapped from the file again
        self.closing = False
        self.waiting: dict[int, list] = {}  # streamed position → its reads, not yet waited for
        self.timed = False  # a pass is timed (pass_starts … pass_ends)
        self.pass_start = self.pass_wait = 0.0
        self.pass_layers = 0
        self.read_layers: set = set()  # streamed layers read at least once: their pages stay mapped over their slots
        start, end, _ = mapping
        self.mapping_span = Span(start, end - start, 0)
        self.thread = threading.Thread(target=self._run, name="ondevice-layer-reader", daemon=True)
        self.thread.start()

    # --- llama.cpp's side -----------------------------------------------------------------------------
    def pass_starts(self) -> None:
        self.timed, self.pass_start, self.pass_wait, self.pass_layers = True, time.perf_counter(), 0.0, 0

    def pass_ends(self) -> PassSplit | None:
        """The pass since pass_starts: its time and the part of it llama.cpp waited for reads."""
        timed, self.timed = self.timed, False
        if not timed or self.failed:
            return None
        return PassSplit(time.perf_counter() - self.pass_start, self.pass_wait, self.pass_layers)

    def before_decode(self) -> None:
        """Before a llama_decode: the kept layers and its first layer must be read."""
        if not self.kept_ready.is_set():
            t0 = time.perf_counter()
            self.kept_ready.wait()
            self.pass_wait += time.perf_counter() - t0 if self.timed else 0.0
        self._await(self.order[0])

    def layer_done(self, i) -> None:
        if i not in self.order:
            return
        if i in self.own:
            with self.cond:
                self.consumed = self._position_of(i, self.consumed) + 1
                self.cond.notify_all()
        self.pass_layers += 1
        after = self.order[(self.order.index(i) + 1) % len(self.order)]
        self._await(after)
        if after == OUTPUT_LAYER:  # a pass without outputs skips the head: the next pass's first layer may come next
            self._await(self.order[0])

    def _position_of(self, layer, at: int) -> int:
        """The next streamed position at or after `at` that is `layer`."""
        m = len(self.streamed)
        return at + (self.streamed.index(layer) - at) % m

    def _await(self, layer) -> None:
        if layer not in self.own:
            return
        t0 = time.perf_counter()
        with self.cond:
            position = self._position_of(layer, self.consumed)
            while position not in self.filled and self.failed is None and not self.closing:
                self.cond.wait()
        if self.timed:
            self.pass_wait += time.perf_counter() - t0

    # --- the reader thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._advise(self.mapping_span, MADV_RANDOM)  # the pages left mapped from the file: a fault reads its page only
            for layer in self.streamed:
                self._map_slot(layer)
            self._read_kept()
            while True:
                with self.cond:
                    while not self.closing and not self._free_slot() and not self._pending():
                        self.cond.wait()
                    if self.closing:
                        return
                    self._free_finished()
                    starts = []
                    while self._free_slot():
                        self.slot_of[self.next_read] = self._slot(self.next_read)
                        starts.append(self.next_read)
                        self.next_read += 1
                    oldest = min((p for p in self.slot_of if p not in self.filled), default=None)
                reads = {p: self._start(p) for p in starts}
                self.waiting.update(reads)
                if oldest is not None:
                    for read in self.waiting.pop(oldest, []):
                        read.result()
                    with self.cond:
                        self.filled.add(oldest)
                        self.cond.notify_all()
        except Exception as err:  # noqa: BLE001 — whatever stops the reader, llama.cpp must not wait for it
            self._map_file_back(err)

    def _read_kept(self) -> None:
        """Read the kept layers into the page cache, once (MADV_POPULATE_READ: it returns when they
        are in), and leave them MADV_NORMAL: their use every pass counts as a reference, so the
        kernel keeps them active (under MADV_SEQUENTIAL references do not count: they were reclaimed
        first), and a fault there, should it evict some, reads around it, not a page."""
        for span in self.kept:
            self._advise(span, MADV_NORMAL)
            for piece in _pieces(span, self.advice_chunk):
                self._advise(piece, MADV_WILLNEED)
        for span in self.kept:
            try:
                self._advise(span, MADV_POPULATE_READ)
            except OSError:  # before Linux 5.14: llama.cpp's first pass faults them in
                break
        self.kept_ready.set()

    def _map_over(self, span: Span, fd: int, offset: int) -> None:
        if self.libc.mmap(span.start, span.length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED, fd, offset) != span.start:
            raise OSError(ctypes.get_errno(), f"mmap over a layer: {os.strerror(ctypes.get_errno())}")

    def _free_finished(self) -> None:
        for p in [p for p in self.slot_of if p < self.consumed and p in self.filled]:
            del self.slot_of[p]
        self.filled = {p for p in self.filled if p >= self.consumed}

    def _slot(self, position: int) -> int:
        """The slot a streamed position's layer always goes to (its place among the streamed layers,
        modulo the number of slots)."""
        return position % len(self.streamed) % self.n_slots

    def _free_slot(self) -> bool:
        """Whether the next position can be read: within one pass of llama.cpp, and its slot free
        (in order: at a pass's end a slot may free a little later than a free choice would)."""
        self._free_finished()
        return self.next_read < self.consumed + len(self.streamed) and self._slot(self.next_read) not in self.slot_of.values()

    def _pending(self) -> bool:
        return any(p not in self.filled for p in self.slot_of)

    def _map_slot(self, layer) -> None:
        """Map the layer's pages over its slot, once: the mapping and its page tables then stay, and
        every later read of the layer fills them without a fault."""
        at = self._slot(self.streamed.index(layer)) * self.slot_bytes
        for span in self.own[layer]:
            self._map_over(span, self.memfd, at)
            at += span.length

    def _start(self, position: int) -> list:
        """Start reading the position's layer into its slot (mapped there by _map_slot)."""
        layer = self.streamed[position % len(self.streamed)]
        self.read_layers.add(layer)
        return [self.pool.submit(self._read_piece, piece) for span in self.own[layer] for piece in _pieces(span, CHUNK)]

    @property
    def counted_twice_bytes(self) -> int:
        """What the process's resident memory counts more than once: every layer read so far shows
        its slot's pages at its own addresses, and the kernel counts each mapping of a page
        (the default pair: ~480 MB of its 560 MB of streamed layers live in ~80 MB of slots)."""
        mapped = sum(span.length for layer in list(self.read_layers) for span in self.own[layer])
        return max(0, mapped - self.bound)

    def _read_piece(self, piece: Span) -> None:
        view = memoryview((ctypes.c_char * piece.length).from_address(piece.start)).cast("B")
        done = 0
        while done < piece.length:
            n = os.preadv(self.direct_fd, [view[done:]], piece.offset + done)
            if n <= 0:
                raise OSError(f"short read of the model file at {piece.offset + done}")
            done += n

    def _advise(self, span: Span, advice: int) -> None:
        advise(self.libc, span, advice)

    def _map_file_back(self, err: Exception) -> None:
        """Map every streamed layer from the file again (the page cache serves it), then let
        llama.cpp go on."""
        self.pool.shutdown(wait=True)
        for span in [s for spans in self.own.values() for s in spans]:
            self.libc.mmap(span.start, span.length, mmap.PROT_READ, mmap.MAP_PRIVATE | MAP_FIXED, self.file_fd, span.offset)
        try:
            self._advise(self.mapping_span, MADV_SEQUENTIAL)  # the kernel streams it now: read ahead on faults
        except OSError:
            pass
        with self.cond:
            self.failed = f"direct reads failed ({err}): streaming left to the kernel"
            self.cond.notify_all()
        self.kept_ready.set()

    def drain(self) -> None:
        """Wait until every slot's read has ended."""
        with self.cond:
            while self.thread.is_alive() and self._pending():
                self.cond.wait(timeout=0.1)

    def close(self) -> None:
        """Stop the reader and close the files (a second call does nothing)."""
        if self.closing:
            return
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join(timeout=5)
        self.pool.shutdown(wait=True)
        for fd in (self.direct_fd, self.file_fd, self.memfd):
            os.close(fd)
