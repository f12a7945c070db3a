"""Profiles: what this machine measured for one model pair, kept as JSON and reused.

A profile = machine facts + bandwidths + latency curves (target pass vs tokens, draft call vs
batch), saved at `<home>/profiles/<machine fingerprint>-<pair>-<backend>.json`. It is reused until
the hardware fingerprint or a model file (size, sha256) changes, or the user asks for `--refresh`.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ondevice.plan.hardware import (
    Bandwidths,
    Curves,
    MachineFacts,
    machine_facts,
    measure_disk_read,
    measure_drafter_curve,
    measure_pinned_bandwidth,
    measure_ram_bandwidth,
    measure_target_curve,
    powers_of_two,
)
from ondevice.paths import home, write_json
from ondevice.protocols import MAX_BUDGET

FORMAT_VERSION = 1


def file_identity(path: Path, sha256: str | None = None) -> dict:
    """How we notice a model file changed: name, size and sha256 (from the catalog; hashing a 35 GB
    file on every run is too slow), else the modification time."""
    st = Path(path).stat()
    return {"name": Path(path).name, "size": st.st_size, "sha256": sha256 or f"mtime:{st.st_mtime_ns}"}


@dataclass
class ProfileBackends:
    """What to profile, from the pipeline. Cheap to make: the backends are built only to measure."""

    pair: str  # catalog name of the model pair
    backend: str  # how the target runs, e.g. "torch-cuda", "llama-cpu" (curves differ per backend)
    model_files: list[tuple[Path, str | None]]  # (path, sha256 if known), the target's file first
    make_target: Callable[[], object]  # -> protocols.Target
    make_decode_batch: Callable[[], Callable[[int], None]]  # -> one drafter call over a batch of n tokens
    overlap_possible: bool = False  # drafter (CPU) and target (GPU) can run at the same time
    max_tree: int = MAX_BUDGET  # largest target pass to time (CPU targets: smaller, their curve is steep)


@dataclass
class Profile:
    pair: str
    backend: str
    machine: MachineFacts
    bandwidths: Bandwidths
    curves: Curves
    model_files: list[dict]  # file_identity() of each model file
    overlap_possible: bool = False
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    measure_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"format": FORMAT_VERSION, "pair": self.pair, "backend": self.backend, "fingerprint": self.machine.fingerprint(),
                "machine": asdict(self.machine), "bandwidths": asdict(self.bandwidths), "curves": self.curves.to_dict(),
                "model_files": self.model_files, "overlap_possible": self.overlap_possible,
                "created": self.created, "measure_seconds": self.measure_seconds}

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"profile format {d.get('format')} is not {FORMAT_VERSION}")
        return cls(d["pair"], d["backend"], MachineFacts.from_dict(d["machine"]), Bandwidths(**d["bandwidths"]),
                   Curves.from_dict(d["curves"]), d["model_files"], d["overlap_possible"], d["created"], d["measure_seconds"])


def profile_path(fingerprint: str, pair: str, backend: str) -> Path:
    return home() / "profiles" / f"{fingerprint}-{pair}-{backend}.json"


def save_profile(profile: Profile) -> Path:
    return write_json(profile_path(profile.machine.fingerprint(), profile.pair, profile.backend), profile.to_dict())


def load_profile(facts: MachineFacts, backends: ProfileBackends) -> Profile | None:
    """The saved profile if it still describes this machine and these model files, else None."""
    path = profile_path(facts.fingerprint(), backends.pair, backends.backend)
    try:
        profile = Profile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files_now = [file_identity(p, sha) for p, sha in backends.model_files]
    if profile.machine.fingerprint() != facts.fingerprint() or profile.model_files != files_now:
        return None
    return profile


def measure_profile(backends: ProfileBackends, show: bool = True, context_tokens: int = 64) -> Profile:
    """Measure everything (minutes for a large target): facts, bandwidths, then each curve."""
    t0 = time.perf_counter()
    facts = machine_facts(home())
    target_file = Path(backends.model_files[0][0])
    # The disk goes first: once a backend has the file mapped its pages can't be dropped from the cache.
    disk = measure_disk_read(target_file)
    ram = measure_ram_bandwidth()
    h2d, d2h = measure_pinned_bandwidth() if facts.gpus else (None, None)

    target = backends.make_target()
    ns = powers_of_two(min(backends.max_tree, target.n_ctx - context_tokens))
    target_curve = measure_target_curve(target, ns, context_tokens, show=show)
    del target  # one model in memory at a time
    gc.collect()

    decode_batch = backends.make_decode_batch()
    drafter_curve = measure_drafter_curve(decode_batch, show=show)
    del decode_batch
    gc.collect()

    return Profile(
        pair=backends.pair, backend=backends.backend, machine=facts,
        bandwidths=Bandwidths(ram, h2d, d2h, disk), curves=Curves(target_curve, drafter_curve),
        model_files=[file_identity(p, sha) for p, sha in backends.model_files],
        overlap_possible=backends.overlap_possible, measure_seconds=time.perf_counter() - t0,
    )


def get_profile(backends: ProfileBackends, refresh: bool = False, show: bool = True) -> tuple[Profile, bool]:
    """(profile, reused): the saved one while it is current, else a fresh measurement, saved."""
    if not refresh:
        saved = load_profile(machine_facts(home()), backends)
        if saved is not None:
            return saved, True
    profile = measure_profile(backends, show=show)
    save_profile(profile)
    return profile, False
