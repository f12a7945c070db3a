"""Measure the disk tier on a real GGUF: `python -m ondevice.offload.bench MODEL.gguf [--passes N]`.

Prints, for the model's decoder layers:
  - bytes per layer as stored (GGUF blocks, what the streamer moves) vs decoded to bf16 / fp32;
  - a plain sequential read of the same region of the file (`dd`-style, 16 MiB reads), page cache
    dropped first;
  - the disk tier: `DiskReader` reading every layer's byte ranges in pass order into 2 staging
    buffers, dropping the pages behind it (what a pass costs when every layer comes from disk).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

from ondevice.machine.facts import drop_page_cache
from ondevice.offload.disk import DiskReader
from ondevice.offload.layout import gguf_tensor_index, layout_from_gguf
from ondevice.sizes import format_bytes

CHUNK = 16 * 2**20


def sequential_read(path: str, begin: int, end: int) -> tuple[int, float]:
    """(bytes, seconds) of reading bytes begin..end front to back after dropping the file's cached pages."""
    drop_page_cache(path)
    view = memoryview(bytearray(CHUNK))
    fd = os.open(path, os.O_RDONLY)
    total, start = 0, time.perf_counter()
    try:
        while total < end - begin and (n := os.preadv(fd, [view[: min(CHUNK, end - begin - total)]], begin + total)):
            total += n
    finally:
        os.close(fd)
    return total, time.perf_counter() - start


def layer_span(layouts: dict) -> tuple[int, int]:
    """The file region holding every layer's bytes (first byte, one past the last)."""
    ranges = [r for layout in layouts.values() for r in layout.file_ranges]
    return min(r.file_offset for r in ranges), max(r.file_offset + r.nbytes for r in ranges)


def disk_tier_pass(path: str, layouts: dict, passes: int) -> tuple[int, float, float]:
    """(bytes, wall seconds, reader's own read seconds) for `passes` passes over every layer."""
    drop_page_cache(path)
    reader = DiskReader(path, layouts, n_buffers=2)
    start = time.perf_counter()
    try:
        pending = [reader.submit(i) for i in sorted(layouts)[:2]]
        order = [i for _ in range(passes) for i in sorted(layouts)]
        for n, _ in enumerate(order):
            ticket = pending.pop(0)
            reader.wait(ticket)
            reader.release(ticket)
            if n + 2 < len(order):
                pending.append(reader.submit(order[n + 2]))
        wall = time.perf_counter() - start
    finally:
        reader.close()
    return reader.stats.bytes_read, wall, reader.stats.read_seconds


def layer_layouts(path: str, dtype: torch.dtype) -> dict:
    """Every `blk.N.` layer's layout, decoded size counted in `dtype` (no model is built)."""
    index = gguf_tensor_index(path)
    layers: dict[int, dict[str, str]] = {}
    for name in index:
        if name.startswith("blk."):
            _, i, rest = name.split(".", 2)
            layers.setdefault(int(i), {})[rest] = name
    layouts = {}
    for i, names in sorted(layers.items()):
        block = nn.Module()  # a stand-in holding meta parameters named like the GGUF tensors
        for rest, name in names.items():
            block.register_parameter(
                rest.replace(".", "_"), nn.Parameter(torch.empty(index[name].shape, dtype=dtype, device="meta"))
            )
        layouts[i] = layout_from_gguf(block, {rest.replace(".", "_"): name for rest, name in names.items()}, index)
    return layouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF file")
    parser.add_argument("--passes", type=int, default=3, help="rounds of (sequential read, disk-tier pass)")
    args = parser.parse_args()
    bf16 = layer_layouts(args.model, torch.bfloat16)
    n = len(bf16)
    stored = sum(layout.nbytes for layout in bf16.values())
    decoded = sum(layout.decoded_bytes for layout in bf16.values())
    weights = decoded // 2
    print(f"{n} layers, {weights / n / 1e6:.1f} M weights per layer")
    print(f"per layer: {format_bytes(stored / n)} as GGUF blocks ({8 * stored / weights:.2f} bits/weight), "
          f"{format_bytes(decoded / n)} as bf16, {format_bytes(2 * decoded / n)} as fp32; "
          f"bf16 / blocks = {decoded / stored:.2f}x")  # fmt: skip
    for _ in range(args.passes):  # alternate, so both see the same state of any cache below the OS
        size, seconds = sequential_read(args.model, *layer_span(bf16))
        rate = format_bytes(size / seconds)
        print(f"sequential read of the layers' region: {format_bytes(size)} in {seconds:.2f} s = {rate}/s")
        read, wall, busy = disk_tier_pass(args.model, bf16, 1)
        print(f"disk tier, one pass of {n} layers:     {format_bytes(read)} in {wall:.2f} s = "
              f"{format_bytes(read / wall)}/s (reader busy {busy:.2f} s = {format_bytes(read / busy)}/s)")  # fmt: skip


if __name__ == "__main__":
    main()
