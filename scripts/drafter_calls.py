"""What one drafter call costs: a llama.cpp drafter's expansion calls timed by nodes per call and threads.

    python scripts/drafter_calls.py [--drafter PATH[,PATH...]] [--threads 1,2] [--nodes 1,2,4,8] [--repeats 15]

Each drafter file is loaded as the pipeline loads a drafter under a memory limit (resident, f16 KV
cache, its VocabTrim head where one is built for it), once per thread count. A call expands n
sibling nodes over a 64-token context (`ModelDrafter.probe_batch`, the profile's own probe); the
loads take turns call by call, so a busy minute hits them alike. Prints medians in ms, and the
ratio of the first thread count's time to each other's (how much the second core buys).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ondevice.draft.llama_drafter import LlamaDrafter

DEFAULT_DRAFTER = Path.home() / ".cache/ondevice/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default=str(DEFAULT_DRAFTER), help="drafter GGUF files, comma-separated")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--nodes", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    paths = [Path(p) for p in args.drafter.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    nodes = [int(n) for n in args.nodes.split(",")]
    loads = {
        (path, t): LlamaDrafter(path, n_ctx=512, threads=t, vocab_trim=True, max_tree=max(nodes) * 2, kv_type="f16", resident=True)
        for path in paths for t in threads
    }  # fmt: skip
    seconds = {(key, n): [] for key in loads for n in nodes}
    for repeat in range(args.repeats):
        order = list(loads) if repeat % 2 == 0 else list(loads)[::-1]
        for key in order:
            for n in nodes:
                t0 = time.perf_counter()
                loads[key].probe_batch(n)
                seconds[key, n].append(time.perf_counter() - t0)
    print(f"ms per call, medians of {args.repeats}")
    print(f"{'drafter':48} {'head':>7} {'threads':>7} " + " ".join(f"{f'{n} nodes':>9}" for n in nodes))
    for path, t in loads:
        row = [1000 * statistics.median(seconds[(path, t), n]) for n in nodes]
        head = "trimmed" if loads[path, t].vocab_trimmed else "full"
        print(f"{path.name[:48]:48} {head:>7} {t:>7} " + " ".join(f"{ms:9.1f}" for ms in row))
    for path in paths:
        first = threads[0]
        for t in threads[1:]:
            ratio = [statistics.median(seconds[(path, first), n]) / statistics.median(seconds[(path, t), n]) for n in nodes]
            print(f"{path.name}: {first} thread(s) / {t} threads: " + " ".join(f"{r:.2f}" for r in ratio))


if __name__ == "__main__":
    main()
