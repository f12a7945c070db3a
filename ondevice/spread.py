"""Layers kept in the faster tier, spread evenly through the stack, so that while one of them computes
the next streamed ones are read (or copied) beside it: a streaming llama.cpp target's layers kept in
RAM (loading/memory.py) and a torch target's layers resident on the GPU or in RAM (offload/placement.py)."""

from __future__ import annotations

from typing import Sequence


def spread_layers(sizes: Sequence[int], room: int) -> tuple[int, ...]:
    """k decoder layers spread evenly through the pass (the middle layer of each of k equal
    stretches), k the largest whose layers fit in `room`. While llama.cpp computes a kept layer the
    reader goes on reading the streamed ones ahead; kept first, they were computed while the
    reader, its slots full, had nothing to do. Spread, a round waits less for the disk
    (docs/measurements/2026-11-27-streaming-1.2gb.md)."""
    for k in range(len(sizes), 0, -1):
        picked = tuple(spread(range(len(sizes)), k))
        if sum(sizes[i] for i in picked) <= room:
            return picked
    return ()


def spread(items: Sequence[int], count: int) -> list[int]:
    """`count` of `items`, evenly spaced: the middle one of each of `count` equal stretches (count = 2
    of 0..7 → [2, 6])."""
    n = len(items)
    return [items[(2 * j + 1) * n // (2 * count)] for j in range(count)] if count else []
