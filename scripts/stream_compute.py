"""Where a streamed pass's compute goes: the same trees through the llama.cpp target loaded six ways.

    python scripts/stream_compute.py [--target PATH] [--nodes 1,5,9,17] [--repeats 5]

1. `ram`: in RAM as ondevice loads a target that fits (weights repacked by llama.cpp);
2. `mapped`: mapped from the file, not repacked (as a streaming target is), no window: the page
   cache holds the whole file after the first pass, so nothing is read;
3. `window-kept`: the direct-read window with every layer kept (read once, then the passes only
   pay for the eval callback and the window's bookkeeping);
4. `window-streamed`: the direct-read window keeping only the LM head: every decoder layer is read
   with O_DIRECT on every pass (run it where RAM is plentiful: the page cache is not involved);
5. `repacked-kept`, `repacked-streamed`: 3 and 4 over the target's copy in llama.cpp's repacked
   layouts (targets/repacked_copy.py; written beside the target first if missing), as a streaming
   target is loaded by default.

A streamed kind may name the direct-read window's reader settings after a slash:
`repacked-streamed/r2/c16/a4` reads with 2 threads, 16 MB a read, 4 layers ahead (the defaults are
`targets/direct_window.py`'s READERS and CHUNK and the memory plan's WINDOW_AHEAD).

Each pass is a chain of n nodes over a 128-token context, timed in rounds across the four loads
(interleaved, so a busy minute hits them alike); for the streamed load the pass's wait for the disk
is subtracted (compute = pass - wait). Prints medians in ms, one row per n.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from ondevice.files.gguf_header import OUTPUT_LAYER, read_header
from ondevice.catalog.stores.derived import repacked_paths
from ondevice.targets import direct_window
from ondevice.targets.llama_target import LlamaTarget
from ondevice.targets.page_cache import WINDOW_AHEAD
from ondevice.targets.repacked_copy import ensure_copy
from ondevice.decode.tree import DraftTree

DEFAULT_TARGET = Path.home() / ".cache/ondevice/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


DEFAULT_READS = {"r": direct_window.READERS, "c": direct_window.CHUNK >> 20, "a": WINDOW_AHEAD}


def reader_settings(kind: str) -> dict:
    """A kind's reader settings: {"r": threads, "c": MB a read, "a": layers ahead}, the defaults filled in."""
    return {**DEFAULT_READS, **{part[0]: int(part[1:]) for part in kind.split("/")[1:]}}


def use_reads(settings: dict) -> None:
    """The reader threads and read size the next window (or the next pass's reads) use."""
    direct_window.READERS, direct_window.CHUNK = settings["r"], settings["c"] << 20


def load(kind: str, path: Path, n_layers: int, threads: int) -> LlamaTarget:
    common = dict(n_ctx=512, threads=threads, max_tree_nodes=64, kv_type="f16")
    settings = reader_settings(kind)
    use_reads(settings)
    kind = kind.split("/")[0]
    if kind == "ram":
        return LlamaTarget(path, **common)
    if kind == "mapped":
        return LlamaTarget(path, streams=True, window=0, **common)
    if kind.startswith("repacked"):
        common["repacked"] = ensure_copy(path, *repacked_paths(path))
    kept = [*range(n_layers), OUTPUT_LAYER] if kind.endswith("-kept") else [OUTPUT_LAYER]
    return LlamaTarget(path, streams=True, window=settings["a"], kept_layers=kept, **common)


def timed_pass(target: LlamaTarget, tokens: list[int], n: int) -> tuple[float, float]:
    """(seconds, of which waiting for the disk) of one n-node chain pass, then undone."""
    base = target.n_cached
    waited = target.page_wait_seconds
    t0 = time.perf_counter()
    target.forward_tree(DraftTree.chain(tokens[0], tokens[1:n]))
    seconds = time.perf_counter() - t0
    target.commit([0])
    target.truncate(base)
    return seconds, target.page_wait_seconds - waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    parser.add_argument("--nodes", default="1,5,9,17")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kinds", default="ram,mapped,window-kept,window-streamed")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    kinds = args.kinds.split(",")
    n_layers = int(read_header(args.target).arch_value("block_count"))
    rng = np.random.default_rng(0)
    context = rng.integers(100, 30000, 128).tolist()
    chain = rng.integers(100, 30000, max(sizes)).tolist()
    targets = {}
    for kind in kinds:
        targets[kind] = load(kind, args.target, n_layers, args.threads)
        targets[kind].prefill(context)
        for n in sizes:  # warm: first passes of a size allocate; the kept layers are read in
            timed_pass(targets[kind], chain, n)
    samples = {(k, n): [] for k in kinds for n in sizes}
    for _ in range(args.repeats):
        for n in sizes:
            for kind in kinds:
                use_reads(reader_settings(kind))
                samples[kind, n].append(timed_pass(targets[kind], chain, n))
    print("ms per pass (compute = pass - disk wait), medians of", args.repeats)
    print("nodes  " + "  ".join(f"{k:>22}" for k in kinds))
    for n in sizes:
        cells = []
        for kind in kinds:
            s = samples[kind, n]
            total, wait = statistics.median(x for x, _ in s), statistics.median(w for _, w in s)
            cells.append(f"{1e3 * total:8.0f} ({1e3 * (total - wait):6.0f} cpu)" if wait else f"{1e3 * total:22.0f}")
        print(f"{n:5d}  " + "  ".join(f"{c:>22}" for c in cells))
    for target in targets.values():
        target.close()


if __name__ == "__main__":
    main()
