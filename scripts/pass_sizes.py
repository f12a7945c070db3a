"""What a llama.cpp target pass costs at every size 1 … N, not only at the profile's sizes (docs/measurements/
2026-11-27-sized-free-rounds.md): the median of a few passes of n fresh tokens over a 64-token context, the
target in RAM, with llama.cpp's weight repacking on and off.

    python scripts/pass_sizes.py --sizes 1-17,20,24,32

On the AVX-512 EPYC here (default pair, 2 threads) a pass of 2 tokens costs 1.9x one, and 8 cost
what 16 do: from 8 tokens on llama.cpp multiplies the Q6_K matrices (the LM head among them) with
its tiled kernel in 16-column tiles; below 8, one dot product per row and token.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ondevice.catalog.hub import local_path
from ondevice.catalog.pairs import load_pair
from ondevice.llama_backend import LlamaContext, LlamaModel

CONTEXT = 64


def sizes(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def pass_seconds(ctx: LlamaContext, n: int, repeats: int, rng: np.random.Generator) -> float:
    times = []
    for _ in range(repeats + 1):  # the first warms the buffers of this size
        tokens = rng.integers(100, 20000, n)
        start = time.perf_counter()
        ctx.decode(tokens, np.arange(CONTEXT, CONTEXT + n), [0] * n, [True] * n)
        times.append(time.perf_counter() - start)
        ctx.seq_rm(0, CONTEXT, -1)
    return float(np.median(times[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="catalog pair whose target is timed (downloaded already)")
    parser.add_argument("--sizes", default="1-17,24,32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    path = local_path(load_pair(args.model).target)
    rng = np.random.default_rng(0)
    for repack in (True, False):
        model = LlamaModel(path, repack=repack)
        ctx = LlamaContext(model, n_ctx=1024, n_seq_max=1)
        prompt = rng.integers(100, 20000, CONTEXT)
        ctx.decode(prompt, np.arange(CONTEXT), [0] * CONTEXT, [False] * (CONTEXT - 1) + [True])
        seconds = {n: pass_seconds(ctx, n, args.repeats, rng) for n in sizes(args.sizes)}
        one = seconds.get(1) or next(iter(seconds.values()))
        print(f"repacking {'on ' if repack else 'off'}: " + "  ".join(f"{n}:{s * 1000:.0f}ms ({s / one:.2f}x)" for n, s in seconds.items()))
        ctx.close()
        model.close()


if __name__ == "__main__":
    main()
