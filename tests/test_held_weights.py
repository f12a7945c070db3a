"""draft/held_weights.py: beside a streaming target, a drafter whose weights llama.cpp computes from
its repacked copies is loaded mapped and the pages it no longer reads are let go: its input embedding
table is not held (the memory plan counts the file less that table) and its trees are those of the
same drafter read whole into memory. A head tied to the input table, or weights llama.cpp does not
repack here, keep the drafter read whole."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ondevice.decode.protocols import DraftSpec
from ondevice.draft import llama_drafter
from ondevice.draft.held_weights import INPUT_TABLE, held_bytes, loads_mapped
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.draft.requantized import IQ4_NL, write_requantized
from ondevice.files.gguf_header import read_header
from ondevice.loading.footprint import ModelSize
from ondevice.machine.repack_layouts import repacks_here
from ondevice.targets.page_cache import find_mapping
from test_requantized_drafter import write_drafter

pytestmark = pytest.mark.skipif(not repacks_here([(IQ4_NL, (256, 512))])[0],
                                reason="llama.cpp repacks no IQ4_NL weight on this CPU")


@pytest.fixture
def drafter(tmp_path):
    """A drafter with a head of its own, its weights in IQ4_NL (the copy a streaming load drafts from)."""
    return write_requantized(write_drafter(tmp_path / "drafter.gguf", QT.Q5_0, arch="qwen3"))


def test_a_drafter_llama_cpp_repacks_is_held_without_its_input_table(drafter):
    size = ModelSize.from_gguf(drafter)
    table = read_header(drafter).tensors[INPUT_TABLE].nbytes
    assert loads_mapped(drafter)
    assert held_bytes(drafter, size.file_bytes, size.embd_bytes) == size.file_bytes - table < size.file_bytes


def test_a_tied_head_or_weights_not_repacked_keep_the_drafter_read_whole(tmp_path):
    tied = write_requantized(write_drafter(tmp_path / "tied.gguf", QT.Q5_0, arch="qwen2"))  # its head is the input table
    not_repacked = write_drafter(tmp_path / "q5.gguf", QT.Q5_0, arch="qwen3")  # Q5_0: computed from the file
    for path in (tied, not_repacked):
        size = ModelSize.from_gguf(path)
        assert not loads_mapped(path)
        assert held_bytes(path, size.file_bytes, size.embd_bytes) == size.file_bytes


def cached_pages(path, offset: int, length: int) -> np.ndarray:
    """Which whole pages of the file's bytes [offset, offset + length) are in the page cache (mincore
    on a mapping of our own: llama.cpp may have unmapped them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    first, last = -(-offset // mmap.PAGESIZE), (offset + length) // mmap.PAGESIZE
    size = path.stat().st_size
    with open(path, "rb") as f:
        base = libc.mmap(None, ctypes.c_size_t(size), mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), ctypes.c_long(0))
    try:
        out = (ctypes.c_ubyte * max(0, last - first))()
        start = ctypes.c_void_p(base + first * mmap.PAGESIZE)
        assert libc.mincore(start, ctypes.c_size_t(len(out) * mmap.PAGESIZE), out) == 0
    finally:
        libc.munmap(ctypes.c_void_p(base), ctypes.c_size_t(size))
    return np.frombuffer(out, np.uint8) & 1


def trees(drafter_model: LlamaDrafter) -> list[tuple[list[int], list[int]]]:
    out, context = [], [5, 17, 42, 9, 11, 23]
    for step in range(6):
        tree = drafter_model.draft(context, DraftSpec("best-first", 8))
        out.append(([int(t) for t in tree.tokens], [int(p) for p in tree.parents]))
        context.append(int(tree.tokens[1]) if len(tree) > 1 else 7 + step)
    return out


def test_a_mapped_drafter_holds_no_page_of_its_file_and_drafts_as_one_read_whole(drafter, monkeypatch):
    """The weights it computes from the file are held in anonymous memory (the page cache keeps no page
    of the file, which the target's reads could evict), its input table is not read but by the row."""
    source = drafter.with_name("drafter.gguf")  # the file a LlamaDrafter is given: it loads the copy
    with monkeypatch.context() as patched:
        patched.setattr(llama_drafter, "loads_mapped", lambda path: False)
        whole = LlamaDrafter(source, n_ctx=128, threads=1, resident=True)  # read into anonymous memory
    size, table = drafter.stat().st_size, read_header(drafter).tensors[INPUT_TABLE]  # (a small file's header read reads it all)
    assert cached_pages(drafter, 0, size).all()  # read by the drafter read whole
    mapped = LlamaDrafter(source, n_ctx=128, threads=1, resident=True)
    try:
        assert whole.model.path == mapped.model.path == drafter
        assert find_mapping(drafter) is not None  # the mapped one's (the other holds no mapping)
        assert not cached_pages(drafter, 0, size).any()
        reference, drafted = trees(whole), trees(mapped)
        assert drafted == reference and any(len(tokens) > 1 for tokens, _ in drafted)
        cached = np.flatnonzero(cached_pages(drafter, 0, size)) * mmap.PAGESIZE
        assert len(cached) and ((cached + mmap.PAGESIZE > table.offset) & (cached < table.offset + table.nbytes)).all()
    finally:
        whole.close()
        mapped.close()
