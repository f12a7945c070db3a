"""Milliseconds per llama.cpp pass of 1 to 17 tokens in RAM, with llama.cpp's repacked weight layouts
(where ggml has them: machine/repack_layouts.py; on a CPU with AMX its AMX kernels with ONDEVICE_AMX=1
where this build runs them) or with the weights as the file stores them.

    python scripts/repack_passes.py MODEL.gguf [--layout repacked|file] [--repeats 9] [--threads 2]

Each pass decodes n new tokens after a 200-token prompt (one sequence, logits for every row) and is
then removed from the KV cache, so every repeat sees the same context. Prints one line: the layout
used, the load and prefill times, and the median ms per pass for each n.
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp

from ondevice import llama_backend as lb
from ondevice.machine import llama_repack
from ondevice.machine.repack_layouts import layouts_repacked

PROMPT = 200
NODES = (1, 2, 4, 9, 17)


def pass_ms(ctx: lb.LlamaContext, n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ctx.decode([500 + i for i in range(n)], [PROMPT + i for i in range(n)], [1] * n, [True] * n)
        times.append((time.perf_counter() - start) * 1000)
        llama_cpp.llama_memory_seq_rm(ctx.memory, 1, -1, -1)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--layout", choices=("repacked", "file"), default="repacked")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    repack = args.layout == "repacked"
    start = time.perf_counter()
    model = lb.LlamaModel(args.model, resident=True, repack=repack)
    ctx = lb.LlamaContext(model, n_ctx=1024, n_seq_max=32, threads=args.threads)
    load = time.perf_counter() - start
    start = time.perf_counter()
    ctx.decode(list(range(100, 100 + PROMPT)), list(range(PROMPT)), [0] * PROMPT, [False] * (PROMPT - 1) + [True])
    prefill = time.perf_counter() - start
    used = ("repacked, AMX kernels" if llama_repack.repack_runs(args.model) and llama_repack.cpu_has_amx() else "repacked") if repack and layouts_repacked() else "file"
    passes = " ".join(f"{n}:{pass_ms(ctx, n, args.repeats):.1f}" for n in NODES)
    print(f"{model.path.name} layout={used} load {load:.2f}s prefill{PROMPT} {prefill * 1000:.0f}ms ms/pass {passes}", flush=True)
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
