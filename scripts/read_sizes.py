"""How fast O_DIRECT reads of a model file go, by request size and reads in flight, with the CPU idle
and with two threads computing beside them (as a streamed pass's reads run beside llama.cpp).

    python scripts/read_sizes.py MODEL.gguf [--settings 4x4,2x16,4x32] [--mb 729] [--rounds 3]

Each setting `RxC` reads the file's first --mb megabytes with R threads, C MB a read, into a reused
memfd (as targets/direct_window.py's slots are), in rounds across the settings so that a slow
minute of the disk hits them alike. Prints GB/s per round and the system CPU time of the reads.
"""

from __future__ import annotations

import argparse
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

BUFFER = 64 << 20  # the reads cycle through this much memory (or one read's, if larger)


def busy(stop: threading.Event) -> None:
    """Keep a core computing (numpy releases the GIL in its matrix product)."""
    a = np.random.rand(400, 400).astype(np.float32)
    while not stop.is_set():
        a @ a


def read_once(path: str, readers: int, chunk: int, total: int, view: memoryview) -> tuple[int, float, float]:
    """(bytes, seconds, system CPU seconds) reading about `total` bytes of `path` with O_DIRECT."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    offsets = range(0, min(total, os.path.getsize(path) - chunk + 1), chunk)
    pieces = [view[i * chunk : (i + 1) * chunk] for i in range(len(view) // chunk)]

    def read(i: int, offset: int) -> int:
        return os.preadv(fd, [pieces[i % len(pieces)]], offset)

    t0, c0 = time.perf_counter(), os.times()
    with ThreadPoolExecutor(readers) as pool:
        list(pool.map(read, range(len(offsets)), offsets))
    seconds, c1 = time.perf_counter() - t0, os.times()
    os.close(fd)
    return len(offsets) * chunk, seconds, c1.system - c0.system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--settings", default="4x4,2x16,4x32", help="READERSxMB, comma-separated")
    parser.add_argument("--mb", type=int, default=729, help="megabytes read per timing")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = [tuple(int(x) for x in s.split("x")) for s in args.settings.split(",")]
    room = max(BUFFER, max(mb for _, mb in settings) << 20)
    memfd = os.memfd_create("read-sizes")
    os.ftruncate(memfd, room)
    view = memoryview(mmap.mmap(memfd, room))
    total = args.mb << 20
    for r in range(args.rounds):
        for cpu in ("idle", "2 busy"):
            stop = threading.Event()
            burners = [threading.Thread(target=busy, args=(stop,)) for _ in range(2 if cpu != "idle" else 0)]
            for t in burners:
                t.start()
            for readers, mb in settings:
                moved, seconds, system = read_once(args.path, readers, mb << 20, total, view)
                print(f"round {r + 1}  CPU {cpu:6s}  {readers} x {mb:2d} MB: {moved / seconds / 1e9:5.2f} GB/s  (system CPU {system:.2f} s)")
            stop.set()
            for t in burners:
                t.join()


if __name__ == "__main__":
    main()
