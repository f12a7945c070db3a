"""A streamed pass and the disk under it: the product's load, passes of n nodes, the reads in flight.

    ONDEVICE_HOME=H python -m ondevice.eval.lowmem --cgroup 0.9GB --read-bps 1GB -- python scripts/pass_reads.py

Loads the default pair for the answers of `ondevice bench --prompts chat --limit 3 -n 48` (the plan
is printed first: this process is smaller than the CLI's, and the plan may take bigger trees and keep
fewer layers), then times chains of n nodes through the target, each in two ways: right after
another pass (`back to back`: what a profile measures), and after a pause as long as a round's
drafting (`after a gap`: the reader fills its slots meanwhile). For each: the pass, its wait for the
disk, the time some direct read was in flight during it, the bytes read during it and their rate.
Medians in ms. Where the reads are in flight nearly the whole pass at the disk's rate, the pass is
bound by the disk, and only more room to read into (slots or kept layers) shortens it.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from ondevice.bench import prompt_sets
from ondevice.cli.decoding import load_pipeline
from ondevice.loading.options import Answers, LoadOptions
from ondevice.plan.latency import TargetPasses
from ondevice.targets import direct_window

READS: list[tuple[float, float, int]] = []  # (start, end, bytes) of every direct read
_lock = threading.Lock()
_read_piece = direct_window.DirectWindow._read_piece


def _timed_read(window, piece) -> None:
    start = time.perf_counter()
    _read_piece(window, piece)
    with _lock:
        READS.append((start, time.perf_counter(), piece.length))


def reads_between(a: float, b: float) -> tuple[float, float]:
    """(seconds some read was in flight, bytes read) within [a, b] (a read across an edge counted pro rata)."""
    with _lock:
        spans = sorted((max(s, a), min(e, b), n * (min(e, b) - max(s, a)) / (e - s)) for s, e, n in READS if e > a and s < b and e > s)
    busy, end = 0.0, a
    for s, e, _ in spans:
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    return busy, sum(n for _, _, n in spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,9,17,32")
    parser.add_argument("--gap", type=float, default=0.15, help="seconds of pause before a pass 'after a gap'")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    direct_window.DirectWindow._read_piece = _timed_read
    texts = prompt_sets.SETS["chat"][:3]
    pipe = load_pipeline(LoadOptions(), answers=Answers(tuple(texts), 48))
    print(pipe.placement_line())
    target = pipe.engine.target
    passes = TargetPasses(target, 64, max(int(n) for n in args.nodes.split(",")))
    for _ in range(3):
        passes(1)  # the kept layers read in
    print("nodes  way           pass   wait  reads in flight   MB   GB/s")
    for n in (int(n) for n in args.nodes.split(",")):
        for gap in (0.0, args.gap):
            rows = []
            for _ in range(args.repeats):
                if gap:
                    time.sleep(gap)
                else:
                    passes(1)
                waited, start = target.page_wait_seconds, time.perf_counter()
                passes(n)
                end = time.perf_counter()
                rows.append((end - start, target.page_wait_seconds - waited, *reads_between(start, end)))
            pass_s, wait, busy, nbytes = (statistics.median(r[i] for r in rows) for i in range(4))
            way = "after a gap" if gap else "back to back"
            print(f"{n:5d}  {way:12s} {1e3 * pass_s:5.0f}  {1e3 * wait:5.0f}  {1e3 * busy:15.0f}  {nbytes / 1e6:4.0f}  {nbytes / busy / 1e9 if busy else 0:5.2f}")
    pipe.close()


if __name__ == "__main__":
    main()
