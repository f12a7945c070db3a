"""A llama.cpp target streaming from disk through the page cache, steered layer by layer.

When the target file is larger than the RAM left for it, llama.cpp's memory-mapped weights are read
from disk on every pass by page faults, and the kernel evicts whatever it likes to make room — the
layers the next pass needs first as readily as the ones just used. `LayerWindow` takes charge:

- llama.cpp reports each decoder layer as it finishes (an eval callback on the layer outputs
  `l_out-{i}`), so the window knows where the pass is;
- the next `ahead` layers' byte ranges of the mapping get MADV_WILLNEED: the kernel reads them
  while the CPU computes the current one (prefetch), and at the end of a pass the first layers of
  the next pass are read while the drafter drafts. One call reads at most the device's readahead
  size (the larger of read_ahead_kb and max_sectors_kb: mm/readahead.c, force_page_cache_ra), so
  spans are advised in pieces of that size (`readahead_bytes`); advised whole, only a tensor's
  first piece would be read ahead, and the rest of a large one (the LM head) faulted in
  synchronously;
- a finished layer that is not `kept` leaves the page cache at once (MADV_DONTNEED drops llama.cpp's
  mapping of its pages, then POSIX_FADV_DONTNEED drops the pages: the kernel invalidates only
  unmapped pages, and this way also those still in a CPU's LRU batch, which MADV_PAGEOUT skips), so
  what the next reads evict is never a page about to be needed;
- `kept` layers (as many as the memory plan leaves room for) are never paged out: they stay cached
  from one pass to the next and are not read again;
- the mapping is MADV_SEQUENTIAL: a page fault (a prefetch that came too late) reads ahead only,
  where the kernel's default "read-around" would also re-read the end of the layer just dropped;
- but a separate input embedding table (`rows`) is MADV_RANDOM: llama.cpp reads one row per token
  there, and a fault under MADV_SEQUENTIAL reads ahead far past it, into the page cache that holds
  the kept layers (docs/measurements/2026-11-23-streaming-1.3gb.md).

The LM head counts as the last layer (OUTPUT_LAYER: output.weight, or token_embd when the head is
tied to it); the input embeddings are read a row per token, each row where it lies (`rows`, above).

The madvise calls run on a helper thread (they may block on I/O or reclaim); the callback only
queues work, and looks (mincore) whether the next layer is all in memory: a pass then splits into
waiting for the disk and computing (pass_split.py). Linux-only; elsewhere `LayerWindow.open` returns None and the target streams as
llama.cpp and the kernel decide.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ondevice.files.gguf_header import OUTPUT_LAYER, read_header
from ondevice.targets.pass_split import LayerStretch, PassSplit, split_pass

MADV_RANDOM, MADV_SEQUENTIAL, MADV_WILLNEED, MADV_DONTNEED = 1, 2, 3, 4
MAP_FIXED = 0x10  # mmap over pages already mapped, at their address
EVICT = -1  # MADV_DONTNEED on the mapping, then POSIX_FADV_DONTNEED on the file
WINDOW_AHEAD = 2  # layers prefetched ahead of the one computing (0: leave streaming to the kernel)
PAGE = mmap.PAGESIZE
DEFAULT_READAHEAD_KIB = 128  # Linux's VM_READAHEAD_PAGES


@dataclass(frozen=True)
class Span:
    start: int  # address in this process
    length: int
    offset: int  # where its first byte is in the file


def readahead_bytes(path: str | Path) -> int:
    """The most one MADV_WILLNEED on `path` reads: the larger of its block device's readahead
    window and largest request, from sysfs; the kernel's default window (128 KiB) when sysfs does
    not say (no block device: tmpfs, network, overlay file systems)."""
    try:
        st = os.stat(path)
        device = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        queue = device / "queue" if (device / "queue").is_dir() else device / ".." / "queue"  # a partition: its disk's
        kib = max(int((queue / name).read_text()) for name in ("read_ahead_kb", "max_sectors_kb"))
    except (OSError, ValueError):
        kib = 0
    return max(kib, DEFAULT_READAHEAD_KIB) << 10


def find_mappings(path: str | Path) -> list[tuple[int, int, int]]:
    """(start address, end address, file offset) of each mapping of `path` in this process (llama.cpp
    unmaps the stretches of its mapping it does not use, leaving several)."""
    try:
        st = os.stat(path)
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[5] != str(Path(path).resolve()):
            continue
        dev_major, dev_minor = (int(x, 16) for x in fields[3].split(":"))
        if int(fields[4]) != st.st_ino or os.makedev(dev_major, dev_minor) != st.st_dev:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        found.append((start, end, int(fields[2], 16)))
    return found


def find_mapping(path: str | Path) -> tuple[int, int, int] | None:
    """(start address, end address, file offset) of the largest mapping of `path` in this process."""
    return max(find_mappings(path), key=lambda m: m[1] - m[0], default=None)


def mapped_layers(path: str | Path) -> tuple[tuple[int, int, int], dict, Span | None] | None:
    """(llama.cpp's mapping of `path`, each layer's tensors that lie in this file — the LM head as
    OUTPUT_LAYER —, the span of a separate input embedding table), or None where the file is not
    mapped or this is not Linux."""
    if not sys.platform.startswith("linux"):
        return None
    mapping = find_mapping(path)
    if mapping is None:
        return None
    header = read_header(path)
    groups: dict = dict(header.layer_ranges())
    head = header.tensors.get("output.weight") or header.tensors.get("token_embd.weight")
    groups[OUTPUT_LAYER] = [t for t in (head, header.tensors.get("output_norm.weight")) if t is not None]
    here = Path(path).resolve()
    tensors = {key: [t for t in group if Path(t.path).resolve() == here] for key, group in groups.items()}  # a split model's other parts: not here
    embd = header.tensors.get("token_embd.weight") if "output.weight" in header.tensors else None  # tied: it is the head
    rows = tensor_span(mapping, embd.offset, embd.nbytes) if embd is not None and Path(embd.path).resolve() == here else None
    return mapping, tensors, rows


def layer_spans(mapping: tuple[int, int, int], tensors: dict) -> dict:
    """Each layer's tensors (mapped_layers) as the whole pages of the mapping that hold them."""
    return {key: [s for s in (tensor_span(mapping, t.offset, t.nbytes) for t in group) if s is not None] for key, group in tensors.items()}


def mapping_libc():
    """The C library with errno kept, its mmap typed to take and give back addresses (for MAP_FIXED
    mappings over pages of a mapping: direct_window.py's slots, draft/held_weights.py's held pages)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return libc


def advise(libc, span: Span, advice: int) -> None:
    """madvise(span, advice) through `libc` (a ctypes CDLL with use_errno); OSError if refused."""
    if libc.madvise(ctypes.c_void_p(span.start), ctypes.c_size_t(span.length), advice) != 0:
        raise OSError(ctypes.get_errno(), f"madvise({advice}): {os.strerror(ctypes.get_errno())}")


def tensor_span(mapping: tuple[int, int, int], offset: int, length: int) -> Span | None:
    """The whole pages of the mapping that hold file bytes [offset, offset + length) (a tensor's)."""
    start, end, file_offset = mapping
    lo = max(start, start + offset - file_offset) // PAGE * PAGE
    hi = min(end, -(-(start + offset - file_offset + length) // PAGE) * PAGE)
    return Span(lo, hi - lo, lo - start + file_offset) if hi > lo else None


def _pieces(span: Span, size: int) -> list[Span]:
    """`span` cut into consecutive spans of at most `size` bytes (a multiple of the page size)."""
    return [Span(span.start + at, min(size, span.length - at), span.offset + at) for at in range(0, span.length, size)]


class LayerWindow:
    def __init__(self, path: str | Path, mapping: tuple[int, int, int], layers: dict, ahead: int = 2, kept: Iterable = (),
                 rows: list[Span] = ()):
        self.layers = layers
        self.order = sorted(k for k in layers if k != OUTPUT_LAYER) + ([OUTPUT_LAYER] if OUTPUT_LAYER in layers else [])
        self.ahead = ahead
        self.kept = set(kept)
        self.chunk = readahead_bytes(path) // PAGE * PAGE  # what one WILLNEED reads at most
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = os.open(path, os.O_RDONLY)
        self.work: queue.Queue[tuple[int, list[Span]] | None] = queue.Queue()
        self.failed: str | None = None  # an madvise the kernel refused: the window stops steering
        self.asked: set[int] = set()  # layers prefetched and not paged out since
        self.nbytes = {key: sum(s.length for s in spans) for key, spans in layers.items()}
        self.measures = True  # mincore answers here: each pass is split into disk wait and compute
        self.residency = (ctypes.c_ubyte * 0)()  # mincore's answer, one byte per page
        self.timed: list[LayerStretch] | None = None  # this pass's layers, while one is timed
        self.pass_start = 0.0
        self.next_in_memory = True
        self.thread = threading.Thread(target=self._run, name="ondevice-page-cache", daemon=True)
        self.thread.start()
        start, end, _ = mapping
        self.work.put((MADV_SEQUENTIAL, [Span(start, end - start, 0)]))
        if rows:
            self.work.put((MADV_RANDOM, list(rows)))  # read a row per token: no readahead around it

    @classmethod
    def open(cls, path: str | Path, ahead: int = 2, kept: Iterable[int] = ()) -> LayerWindow | None:
        """The window over llama.cpp's mapping of `path` (call after the model is loaded), or None
        where this cannot work (not Linux, the file is not mapped)."""
        found = mapped_layers(path)
        if found is None:
            return None
        mapping, tensors, rows = found
        return cls(path, mapping, layer_spans(mapping, tensors), ahead, kept, [rows] if rows else [])

    # --- called from llama.cpp's compute (keep it quick: queue the work) ---------------------------
    def pass_starts(self) -> None:
        for i in self.order[: self.ahead]:
            self._prefetch(i)
        if self.measures:
            self.timed, self.pass_start = [], time.perf_counter()
            self.next_in_memory = self.in_memory(self.order[0]) if self.order else True

    def before_decode(self) -> None:
        """Called before each llama_decode (direct_window.DirectWindow waits there)."""

    def pass_ends(self) -> PassSplit | None:
        """The disk wait / compute split of the pass since pass_starts (pass_split.py); None where
        residency cannot be seen or no layer was in memory to price computing by."""
        timed, self.timed = self.timed, None
        if not timed or self.failed:
            return None
        return split_pass(self.pass_start, timed, time.perf_counter())

    def in_memory(self, layer) -> bool:
        """Whether every page of the layer is in the page cache now (mincore)."""
        for span in self.layers[layer]:
            pages = -(-span.length // PAGE)
            if len(self.residency) < pages:
                self.residency = (ctypes.c_ubyte * pages)()
            if self.libc.mincore(ctypes.c_void_p(span.start), ctypes.c_size_t(span.length), self.residency) != 0:
                self.measures = False  # cannot tell here: stop measuring, keep steering
                return True
            if not (np.frombuffer(self.residency, np.uint8, count=pages) & 1).all():
                return False
        return True

    def layer_done(self, i: int) -> None:
        if i not in self.layers:
            return
        if self.timed is not None:
            self.timed.append(LayerStretch(time.perf_counter(), self.nbytes[i], self.next_in_memory))
            following = self.order[(self.order.index(i) + 1) % len(self.order)]
            self.next_in_memory = following in self.kept or self.in_memory(following)
        if i not in self.kept:
            self.asked.discard(i)
            self._queue(EVICT, i)
        position = self.order.index(i)
        for step in range(1, self.ahead + 1):  # the next layers, wrapping round to the next pass's first
            self._prefetch(self.order[(position + step) % len(self.order)])

    def _prefetch(self, layer: int) -> None:
        if layer not in self.asked:
            self.asked.add(layer)
            self._queue(MADV_WILLNEED, layer)

    def _queue(self, advice: int, layer: int) -> None:
        if self.failed is None:
            self.work.put((advice, self.layers[layer]))

    # --- helper thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while (item := self.work.get()) is not None:
            advice, spans = item
            try:
                for span in spans:
                    if advice == MADV_WILLNEED:
                        for piece in _pieces(span, self.chunk):
                            self._advise(piece, MADV_WILLNEED)
                        continue
                    self._advise(span, MADV_DONTNEED if advice == EVICT else advice)
                    if advice == EVICT:
                        os.posix_fadvise(self.fd, span.offset, span.length, os.POSIX_FADV_DONTNEED)
            except OSError as err:
                self.failed = f"page-cache advice failed ({err}): streaming left to the kernel"
            self.work.task_done()
        self.work.task_done()

    def _advise(self, span: Span, advice: int) -> None:
        advise(self.libc, span, advice)

    def drain(self) -> None:
        """Wait until every queued madvise has been made."""
        self.work.join()

    def close(self) -> None:
        """Stop the advising thread and close the file (a second call does nothing)."""
        if self.fd is None:
            return
        self.work.put(None)
        self.thread.join(timeout=5)
        fd, self.fd = self.fd, None
        os.close(fd)
