"""One of the processes of the concurrent state test (test_state.py): writes and reads one state file.

    python state_child.py PATH WRITER N

N times: save a record of its own (writer, i, a padding of i-dependent length and its length) with
`paths.write_json`, then read the file with `paths.read_state` and check what it got is a whole
record of either writer. Prints one JSON line: {"writes", "reads", "invalid", "missing"}; anything a
read warned about goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys

from ondevice.paths import read_state, write_json


def whole(data) -> dict:
    """The record if it is whole (raises TypeError otherwise: read_state counts it as damaged)."""
    if not (isinstance(data, dict) and data.get("writer") in ("a", "b") and isinstance(data.get("pad"), str)
            and len(data["pad"]) == data.get("length")):
        raise TypeError("not a whole record")
    return data


def main(path: str, writer: str, n: str) -> None:
    counts = {"writes": 0, "reads": 0, "invalid": 0, "missing": 0}
    for i in range(int(n)):
        length = 100 + (i * 7919) % 30_000  # records of many sizes: a torn write would show
        if write_json(path, {"writer": writer, "i": i, "length": length, "pad": writer * length}) is not None:
            counts["writes"] += 1
        record = read_state(path, whole, "test record")
        counts["reads"] += 1
        if record is None:
            counts["invalid" if os.path.exists(path) else "missing"] += 1
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
