"""What a drafter beside a streaming target holds in RAM: loaded mapped, then its file's pages let go.

Beside a target that streams, every byte the drafter holds is a byte of the target read again each
pass. A drafter read whole into anonymous memory (llama.cpp's `resident` load) holds its input
embedding table too, though a drafter fed embeddings (a trimmed vocabulary, vocabtrim/head.py)
never reads it and one fed token ids reads a row per token: 40 MB of the default drafter's 279.

Where llama.cpp computes nearly all of a drafter's weights from its repacked copies
(machine/repack_layouts.py), those copies are anonymous memory whatever the load, and the file is
needed only while loading. So such a drafter is loaded mapped, and then `let_go` copies the few
weights llama.cpp computes from the file into anonymous memory in place (held like a resident
load's: the target's reads cannot evict them; left mapped, they were read again, ~40 MB a pass
under 0.9 GB) and drops the rest from this process and the page cache: the input table is then
read never (a drafter fed embeddings) or by the row. Elsewhere (no repacked layouts here, or a
file mostly of types it does not repack) the drafter is read whole into anonymous memory.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import sys
from pathlib import Path

import numpy as np

from ondevice.files.gguf_header import read_header
from ondevice.machine.facts import drop_page_cache
from ondevice.machine.repack_layouts import repacks_here
from ondevice.targets.page_cache import MADV_DONTNEED, MADV_RANDOM, MAP_FIXED, PAGE, Span, advise, find_mappings, mapping_libc, tensor_span

MAPPED_SHARE = 0.1  # at most this share of the weights' bytes computed from the file (mapped) for a mapped load
INPUT_TABLE = "token_embd.weight"
HOLD_CHUNK = 4 << 20  # bytes copied into anonymous memory at a time


def _unread(path: str | Path) -> tuple[dict, set[str], bool]:
    """(the file's tensors, the names of those llama.cpp does not read after loading it here: the weights
    it repacks and the input table, whether the rest is at most MAPPED_SHARE of the weights' bytes),
    read once a file: every plan of a load asks, and the load again."""
    stat = os.stat(path)
    return _unread_in(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _unread_in(path: str, size: int, mtime_ns: int) -> tuple[dict, set[str], bool]:
    tensors = read_header(path).tensors
    weights = [t for name, t in tensors.items() if name != INPUT_TABLE and len(t.shape) == 2]
    repacked = repacks_here([(t.qtype, tuple(t.shape)) for t in weights])
    mapped = sum(t.nbytes for t, fast in zip(weights, repacked) if not fast)
    small = mapped <= MAPPED_SHARE * sum(t.nbytes for t in weights) and len(weights) > 0
    return tensors, {t.name for t, fast in zip(weights, repacked) if fast} | {INPUT_TABLE}, small


def loads_mapped(path: str | Path) -> bool:
    """Whether this drafter file loads mapped beside a streaming target: its input embeddings are a
    table of their own (not its LM head), llama.cpp repacks all but MAPPED_SHARE of the bytes of its
    other weights here, and this is Linux."""
    tensors, _, small = _unread(path)
    # a head that is the input table is read whole by every call; elsewhere than Linux the pages cannot be held in place
    return "output.weight" in tensors and sys.platform.startswith("linux") and small


def held_bytes(path: str | Path, file_bytes: int, input_table_bytes: int) -> int:
    """What the drafter in `path` holds in RAM beside a streaming target: its file, less its input
    embedding table where it loads mapped."""
    return file_bytes - input_table_bytes if loads_mapped(path) else file_bytes


def let_go(path: str | Path) -> bool:
    """Once llama.cpp has loaded `path` mapped: hold what it still computes from the file (weights it
    does not repack, norms) in anonymous memory, copied in place, and drop the rest (the weights it
    copied into its repacked layouts, the input table) from this process's mappings and from the page
    cache. The input table is marked random-access: a row read alone, not with its neighbours. False
    where the file is not mapped or the kernel refused (what was done so far stays correct: the
    pages held hold the file's bytes, the pages dropped are read again if used)."""
    mappings = find_mappings(path)
    if not mappings:
        return False
    tensors, unread, _ = _unread(path)
    libc = mapping_libc()
    try:
        for mapping in mappings:
            held = _pages(mapping, [t for name, t in tensors.items() if name not in unread])
            for first, last, keep in _runs(held):
                span = Span(mapping[0] + first * PAGE, (last - first) * PAGE, mapping[2] + first * PAGE)
                if keep:
                    _hold(libc, span)
                else:
                    advise(libc, span, MADV_DONTNEED)
            table = tensor_span(mapping, tensors[INPUT_TABLE].offset, tensors[INPUT_TABLE].nbytes)
            if table is not None:
                advise(libc, table, MADV_RANDOM)
        drop_page_cache(Path(path))  # nothing mapped from it is held now (flushed first: a copy written moments ago)
    except OSError:
        return False
    return True


def _pages(mapping: tuple[int, int, int], tensors) -> np.ndarray:
    """Which pages of the mapping hold bytes of these tensors."""
    start, end, _ = mapping
    pages = np.zeros((end - start) // PAGE, bool)
    for tensor in tensors:
        span = tensor_span(mapping, tensor.offset, tensor.nbytes)
        if span is not None:
            pages[(span.start - start) // PAGE : (span.start - start + span.length) // PAGE] = True
    return pages


def _runs(flags: np.ndarray) -> list[tuple[int, int, bool]]:
    """(first, end, flag) of each run of equal flags."""
    edges = np.flatnonzero(np.diff(flags.astype(np.int8))) + 1
    bounds = [0, *edges.tolist(), len(flags)]
    return [(a, b, bool(flags[a])) for a, b in zip(bounds, bounds[1:]) if b > a]


def _hold(libc, span: Span) -> None:
    """Replace the mapped pages of `span` by anonymous ones holding the same bytes, at the same
    address, HOLD_CHUNK bytes at a time (the copy in between is this much memory more)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED
    for start in range(span.start, span.start + span.length, HOLD_CHUNK):
        length = min(HOLD_CHUNK, span.start + span.length - start)
        data = ctypes.string_at(start, length)
        if libc.mmap(start, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0) != start:
            raise OSError(ctypes.get_errno(), f"mmap: {os.strerror(ctypes.get_errno())}")
        ctypes.memmove(start, data, length)
