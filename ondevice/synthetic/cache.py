"""What a synthetic model measured on this machine, kept so predictions never re-measure.

One JSON file per (machine fingerprint, shape, role, backend, memory budgets) under
`<home>/synthetic/curves/`. A role "target" record holds the target pass time vs tokens per pass;
a role "drafter" record the draft call time vs batch size (the curves the planner's cost model
takes: `ondevice.plan.curve.Curves`).
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ondevice.paths import read_state, state_file, write_json
from ondevice.plan.curve import LatencyCurve

FORMAT_VERSION = 1


@dataclass
class Traffic:
    """The weight bytes one pass reads from the tier that bounds it, and that tier's measured speed."""

    bytes_per_pass: int
    source: str  # "RAM", "disk", "pinned RAM → GPU", "GPU memory"
    reference: str  # what the bandwidth is: "RAM copy", "disk read", "pinned → GPU"
    reference_gbps: float | None  # measured on this machine in the same run (None: not measurable)
    copy_gbps: float | None = None  # a layer streamer's own rate while copying (streamed targets only)


@dataclass
class SyntheticMeasurement:
    shape: str
    role: str  # "target" (pass vs tokens) or "drafter" (draft call vs batch)
    backend: str  # e.g. "llama-cpu-t2", "torch-cuda-t8"
    budgets: str  # "" or e.g. "gpu 6GiB, ram 8GiB": the memory budgets it ran under
    placement: str  # where the weights lived, in words
    curve: LatencyCurve
    traffic: Traffic
    file_bytes: int
    seed: int
    note: str = ""  # e.g. why the curve stops where it does
    busy_cores: float | None = None  # others' cores while it was measured, when the machine was busy (then not cached)
    per_pass: dict | None = None  # a target's passes, per size: median seconds, bytes read from storage (pass_meter.PassMeter)
    memory: dict | None = None  # a llama.cpp target's memory plan (MemoryPlan.to_dict: kept layers, predicted bytes read per pass)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    @property
    def read_bytes_per_pass(self) -> float | None:
        """What a pass read from storage, measured: the median over the sizes timed (None: not known)."""
        known = [b for b in (self.per_pass or {}).get("read_bytes", []) if b is not None]
        return statistics.median(known) if known else None

    @property
    def achieved_gbps(self) -> float:
        """Bytes per pass over the time of the smallest pass (n = 1): the bandwidth the pass achieved."""
        return self.traffic.bytes_per_pass / self.curve(self.curve.ns[0]) / 1e9

    def to_dict(self) -> dict:
        return {"format": FORMAT_VERSION, **asdict(self), "curve": self.curve.to_dict(), "achieved_gbps": self.achieved_gbps}

    @classmethod
    def from_dict(cls, d: dict) -> "SyntheticMeasurement":
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {d.get('format')} is not {FORMAT_VERSION}")
        fields = {k: v for k, v in d.items() if k not in ("format", "achieved_gbps")}
        return cls(**{**fields, "curve": LatencyCurve.from_dict(d["curve"]), "traffic": Traffic(**d["traffic"])})


def measurement_path(fingerprint: str, shape: str, role: str, backend: str, budgets: str = "") -> Path:
    suffix = "-" + re.sub(r"[^A-Za-z0-9.]+", "", budgets) if budgets else ""
    return state_file("synthetic/curves", f"{fingerprint}-{shape}-{role}-{backend}{suffix}.json")


def save_measurement(fingerprint: str, m: SyntheticMeasurement) -> Path:
    return write_json(measurement_path(fingerprint, m.shape, m.role, m.backend, m.budgets), m.to_dict())


def load_measurement(fingerprint: str, shape: str, role: str, backend: str, budgets: str = "") -> SyntheticMeasurement | None:
    """The cached measurement, or None when this machine has not measured it (or the file is unreadable)."""
    return read_state(measurement_path(fingerprint, shape, role, backend, budgets), SyntheticMeasurement.from_dict, "synthetic-model measurement")
