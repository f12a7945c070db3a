"""`ondevice bench` with one of its fixed settings changed, to measure what the setting is worth.

    python scripts/bench_with.py [--batch-spread NATS] [--leaf-margin NATS] [--readers N] [--chunk-mb MB] [--tree-sizes N,N] -- BENCH ARGS...

--batch-spread: best-first's BATCH_SPREAD (draft/builders.py: a drafter call decodes the waiting nodes
    within this many nats of the best one);
--leaf-margin: best-first's LEAF_MARGIN (draft/builders.py: kept nodes this close to the weakest kept
    one are left unexpanded; 0 is the exact search);
--readers, --chunk-mb: the direct-read window's READERS and CHUNK (targets/direct_window.py: O_DIRECT
    reads in flight at once, bytes a read);
--tree-sizes: the memory plan's TREE_SIZES (loading/memory.py: the largest trees a streaming target's
    buffers may be sized for, largest first; the plan takes the largest that keeps the LM head in RAM).

Everything after `--` goes to `ondevice bench` as it is, e.g.

    python -m ondevice.eval.lowmem --cgroup 0.9GB -- python scripts/bench_with.py --readers 2 --chunk-mb 8 -- \\
        --trees best-first --budgets 16 --prompts heldout35-chat --limit 2 -n 32 --json --out O.json
"""

from __future__ import annotations

import argparse
import sys

from ondevice.cli.app import main as ondevice_main
from ondevice.draft import llama_drafter
from ondevice.loading import memory
from ondevice.targets import direct_window


def set_drafters(**settings) -> None:
    """Every LlamaDrafter made from now on gets these keyword arguments (batch_spread, leaf_margin)."""
    make = llama_drafter.LlamaDrafter.__init__

    def with_settings(self, *args, **kwargs):
        make(self, *args, **{**kwargs, **settings})

    llama_drafter.LlamaDrafter.__init__ = with_settings


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-spread", type=float)
    parser.add_argument("--leaf-margin", type=float)
    parser.add_argument("--readers", type=int)
    parser.add_argument("--chunk-mb", type=int)
    parser.add_argument("--tree-sizes", type=lambda text: tuple(int(n) for n in text.split(",")))
    args = parser.parse_args(argv[:cut])
    drafter_settings = {"batch_spread": args.batch_spread, "leaf_margin": args.leaf_margin}
    set_drafters(**{k: v for k, v in drafter_settings.items() if v is not None})
    if args.readers is not None:
        direct_window.READERS = args.readers
    if args.chunk_mb is not None:
        direct_window.CHUNK = args.chunk_mb << 20
    if args.tree_sizes is not None:
        memory.TREE_SIZES = args.tree_sizes
    sys.argv = ["ondevice", "bench", *argv[cut + 1 :]]
    ondevice_main()


if __name__ == "__main__":
    main()
