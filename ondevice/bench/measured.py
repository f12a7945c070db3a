"""What `ondevice bench` measured for a real pair on this machine, kept beside the predictions.

One JSON file per (machine fingerprint, pair, target backend) under `<home>/measured/`: each
configuration's tok/s and tokens per pass from the latest bench that ran it (a later bench of the
same configuration replaces it). `ondevice models --predict` shows these next to its predictions.
"""

from __future__ import annotations

import time
from pathlib import Path

from ondevice.paths import read_state, state_file, write_json


def measured_path(fingerprint: str, pair: str, backend: str) -> Path:
    return state_file("measured", f"{fingerprint}-{pair}-{backend}.json")


def record_bench(fingerprint: str, pair: str, backend: str, results) -> Path:
    """Merge bench results (BenchResult rows; failed or auto rows skipped) into the pair's record."""
    path = measured_path(fingerprint, pair, backend)
    record = load_measured(fingerprint, pair, backend)
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for r in results:
        if r.error is None and r.totals.target_passes and not r.config.startswith("auto"):
            record[r.config] = {"tokens_per_second": r.tokens_per_second, "tokens_per_pass": r.tokens_per_pass,
                                "builder": r.builder, "budget": r.budget, "prompts": r.prompts, "measured": when}  # fmt: skip
    return write_json(path, record)


def load_measured(fingerprint: str, pair: str, backend: str) -> dict[str, dict]:
    """{config name: {tokens_per_second, tokens_per_pass, builder, budget, …}}; {} if never benched."""
    return read_state(measured_path(fingerprint, pair, backend), _records, "bench record") or {}


def _records(data) -> dict[str, dict]:
    rows_ok = isinstance(data, dict) and all(isinstance(row, dict) and isinstance(row.get("tokens_per_second"), (int, float))
                                             and isinstance(row.get("budget"), (int, type(None))) for row in data.values())
    if not rows_ok:
        raise TypeError("expected {config: {tokens_per_second, budget, ...}}")
    return data
