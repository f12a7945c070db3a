"""Profiles: what this machine measured for one model pair, kept as JSON and reused.

A profile = machine facts + bandwidths + latency curves (target pass vs tokens, draft call vs
batch) of every backend measured so far (llama.cpp, ONNX Runtime, torch), saved at
`<home>/profiles/<machine fingerprint>-<pair>-<key>.json` (key: e.g. "cpu-t2", what the curves
depend on besides the backend). It is reused until the hardware fingerprint or a model file
(size, sha256) changes, or the user asks for `--refresh`; a backend not measured yet is measured
when it is first needed and added. `curves` are those of the backends the pipeline loaded;
`targets`/`drafters` hold all, so the planner can compare backends as it compares trees
(plan/backends.py).

Curves are timed as `ondevice.plan.timing` times calls: interleaved sweeps judged by what other
processes did meanwhile. A profile whose samples stayed disturbed is saved with `busy` set: it is
used (better than nothing; the planner's closed loop corrects it) and measured again at the next
chance (`needs_measuring`). `profile_steps` measures one sample at a time, so a chat can measure
while its user reads or types (plan/auto.py); `measure_profile` runs it to the end.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ondevice.machine.facts import Bandwidths, MachineFacts, machine_facts, measure_disk_read, measure_pinned_bandwidth, measure_ram_bandwidth
from ondevice.plan.curve import Curves, LatencyCurve, pass_sizes, powers_of_two
from ondevice.plan.latency import target_steps
from ondevice.plan.timing import Timing, timing_steps
from ondevice.errors import OndeviceError
from ondevice.paths import home, read_state, state_file, write_json
from ondevice.machine.ram import return_freed_memory
from ondevice.decode.protocols import MAX_BUDGET

DRAFT_BATCH_MAX = 128  # the widest drafter call a profile times

FORMAT_VERSION = 4  # 2: every backend's curves; 3: passes of 2^k and 2^k + 1; 4: contention-checked timing


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
    target_name: str = "target"  # the target backend make_target builds: "llama", "onnx", "torch"
    drafter_name: str = "drafter"  # the drafter backend make_decode_batch runs: "llama", "onnx"
    # the other backends `ondevice profile` compares: name -> factory, as make_target / make_decode_batch
    other_targets: dict[str, Callable[[], object]] = field(default_factory=dict)
    other_drafters: dict[str, Callable[[], Callable[[int], None]]] = field(default_factory=dict)
    key: str | None = None  # names the profile file with the pair (default: backend)
    memory: object | None = None  # load.memory.MemoryPlan of a llama.cpp target: in RAM or streamed
    profile_first: bool = False  # measure a missing profile before the first answer (a GPU target: seconds)
    lean_curve: LatencyCurve | None = None  # a streaming load without the drafter model: its passes timed at load (AlonePass)
    yardstick: object | None = None  # a streaming load: the drafter-less pass timed lately (plan/arms.Yardstick, ArmBook.rescale)

    @property
    def profile_key(self) -> str:
        return self.key or self.backend


@dataclass
class Profile:
    pair: str
    backend: str
    machine: MachineFacts
    bandwidths: Bandwidths
    curves: Curves | None  # the loaded backends' (get_profile sets them)
    model_files: list[dict]  # file_identity() of each model file
    overlap_possible: bool = False
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    measure_seconds: float = 0.0
    targets: dict[str, LatencyCurve] = field(default_factory=dict)  # every target backend measured, by name
    drafters: dict[str, LatencyCurve] = field(default_factory=dict)  # every drafter backend measured
    skipped: dict[str, str] = field(default_factory=dict)  # "target onnx" -> why it could not be measured
    target_placement: str = "ram"  # "disk": the target streamed while its curves were measured (memory plan)
    busy: bool = False  # some size had no sample undisturbed by other processes: measure again later
    others_cores: float = 0.0  # what other processes used during the disturbed samples
    target_context: int = 64  # tokens of context the target passes were timed over
    alone: dict | None = None  # streaming pairs: the target's 1-token pass without the drafter (loading/drafter_room.AlonePass)

    def curves_for(self, target: str, drafter: str) -> Curves:
        return Curves(self.targets[target], self.drafters[drafter])

    def to_dict(self) -> dict:
        curves = lambda named: {name: c.to_dict() for name, c in named.items()}  # noqa: E731
        return {"format": FORMAT_VERSION, "pair": self.pair, "backend": self.backend, "fingerprint": self.machine.fingerprint(),
                "machine": asdict(self.machine), "bandwidths": asdict(self.bandwidths), "curves": self.curves.to_dict(),
                "targets": curves(self.targets), "drafters": curves(self.drafters), "skipped": self.skipped,
                "model_files": self.model_files, "overlap_possible": self.overlap_possible,
                "created": self.created, "measure_seconds": self.measure_seconds, "target_placement": self.target_placement,
                "busy": self.busy, "others_cores": self.others_cores, "target_context": self.target_context,
                "alone": self.alone}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"profile format {d.get('format')} is not {FORMAT_VERSION}")
        curves = lambda named: {name: LatencyCurve.from_dict(c) for name, c in named.items()}  # noqa: E731
        return cls(d["pair"], d["backend"], MachineFacts.from_dict(d["machine"]), Bandwidths(**d["bandwidths"]),
                   Curves.from_dict(d["curves"]), d["model_files"], d["overlap_possible"], d["created"], d["measure_seconds"],
                   curves(d["targets"]), curves(d["drafters"]), d.get("skipped", {}), d.get("target_placement", "ram"),
                   bool(d.get("busy", False)), float(d.get("others_cores", 0.0)), int(d.get("target_context", 64)), d.get("alone"))  # fmt: skip


def profile_path(fingerprint: str, pair: str, backend: str) -> Path:
    return state_file("profiles", f"{fingerprint}-{pair}-{backend}.json")


def save_profile(profile: Profile) -> Path:
    return write_json(profile_path(profile.machine.fingerprint(), profile.pair, profile.backend), profile.to_dict())


def load_profile(facts: MachineFacts, backends: ProfileBackends) -> Profile | None:
    """The saved profile if it still describes this machine and these model files, else None."""
    profile = read_state(profile_path(facts.fingerprint(), backends.pair, backends.profile_key), Profile.from_dict, "profile")
    if profile is None:
        return None
    files_now = [file_identity(p, sha) for p, sha in backends.model_files]
    if profile.machine.fingerprint() != facts.fingerprint() or profile.model_files != files_now:
        return None
    return profile


def new_profile(backends: ProfileBackends, measure_disk: bool = True) -> Profile:
    """A profile with the machine's facts and bandwidths and no curves yet. The disk is read only
    where the target file is not loaded yet: a mapped file's pages cannot be dropped from the cache."""
    facts = machine_facts(home())
    disk = measure_disk_read(Path(backends.model_files[0][0])) if measure_disk else None
    ram = measure_ram_bandwidth()
    h2d, d2h = measure_pinned_bandwidth() if facts.gpus else (None, None)
    return Profile(
        pair=backends.pair, backend=backends.profile_key, machine=facts, bandwidths=Bandwidths(ram, h2d, d2h, disk),
        curves=None, model_files=[file_identity(p, sha) for p, sha in backends.model_files],
        overlap_possible=backends.overlap_possible, target_placement=backends.memory.placement if backends.memory is not None else "ram",
    )  # fmt: skip


def measure_profile(backends: ProfileBackends, show: bool = True, compare: bool = False, context_tokens: int = 64) -> Profile:
    """Measure everything now (the loaded backends; with `compare`, the others too, in the same run)."""
    t0 = time.perf_counter()
    profile = new_profile(backends)
    with _progress(show) as progress:
        task = progress.add_task("profiling", total=None)
        for label in profile_steps(profile, backends, compare, context_tokens):
            progress.update(task, description=label, advance=1)
    profile.measure_seconds = time.perf_counter() - t0
    return profile


def _progress(show: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=Console(stderr=True), disable=not show,
                    transient=True)


def _wanted(backends: ProfileBackends, compare: bool) -> tuple[dict, dict]:
    targets = {backends.target_name: backends.make_target, **(backends.other_targets if compare else {})}
    drafters = {backends.drafter_name: backends.make_decode_batch, **(backends.other_drafters if compare else {})}
    return targets, {name: make for name, make in drafters.items() if make is not None}


def profile_steps(profile: Profile, backends: ProfileBackends, compare: bool = False, context_tokens: int = 64,
                  redo: bool = False) -> Iterator[str]:
    """Add the curves of the wanted backends the profile lacks (all of them with `redo`), one timed
    sample per step; yields what it is measuring. A backend that cannot run here (OndeviceError: an
    unsupported file, …) is recorded in `skipped`. The target's cache is left as found."""
    targets, drafters = _wanted(backends, compare)
    widest = 1
    for name, make_target in targets.items():
        if not redo and (name in profile.targets or f"target {name}" in profile.skipped):
            widest = max(widest, profile.targets[name].max_n if name in profile.targets else 1)
            continue
        with _skipping(profile, f"target {name}"):
            target = make_target()
            ns = pass_sizes(min(backends.max_tree, target.n_ctx - context_tokens - target.n_cached))
            passes, steps = target_steps(target, ns, context_tokens)
            try:
                timing = yield from _labelled(steps, f"target pass vs tokens ({name})")
            finally:
                passes.undo()
            profile.targets[name] = timing.curve
            profile.target_context = passes.context
            _note(profile, timing)
            widest = max(widest, timing.curve.max_n)
        target = None  # one model in memory at a time (the loaded one stays with the pipeline)
        return_freed_memory()
    batches = powers_of_two(max(2, min(DRAFT_BATCH_MAX, widest)))  # no level of a tree is wider than the tree
    for name, make_decode_batch in drafters.items():
        if not redo and (name in profile.drafters or f"drafter {name}" in profile.skipped):
            continue
        with _skipping(profile, f"drafter {name}"):
            timing = yield from _labelled(timing_steps(batches, make_decode_batch()), f"draft call vs batch ({name})")
            profile.drafters[name] = timing.curve
            _note(profile, timing)
        return_freed_memory()
    if backends.target_name in profile.targets and backends.drafter_name in profile.drafters:
        profile.curves = profile.curves_for(backends.target_name, backends.drafter_name)


def _labelled(steps, label: str):
    """Re-yield a timing_steps generator's steps as `label: n tokens`; returns its Timing."""
    while True:
        try:
            n = next(steps)
        except StopIteration as done:
            return done.value
        yield f"{label}: n={n}"


def _note(profile: Profile, timing: Timing) -> None:
    """Keep what the timing says of other processes: busy if any curve stayed disturbed."""
    if timing.busy:
        profile.busy = True
        profile.others_cores = max(profile.others_cores, timing.others_cores)


def measure_backends(profile: Profile, backends: ProfileBackends, show: bool, compare: bool, context_tokens: int = 64) -> bool:
    """Add the curves of the wanted backends the profile lacks, now; True if it measured anything."""
    measured = False
    with _progress(show) as progress:
        task = progress.add_task("profiling", total=None)
        for label in profile_steps(profile, backends, compare, context_tokens):
            progress.update(task, description=label, advance=1)
            measured = True
    return measured


@contextmanager
def _skipping(profile: Profile, what: str):
    try:
        yield
    except OndeviceError as err:
        profile.skipped[what] = str(err)


def saved_profile(backends: ProfileBackends) -> Profile | None:
    """The saved profile with the loaded backends' curves, or None: nothing is measured."""
    saved = load_profile(machine_facts(home()), backends)
    if saved is None or backends.target_name not in saved.targets or backends.drafter_name not in saved.drafters:
        return None
    saved.curves = saved.curves_for(backends.target_name, backends.drafter_name)
    return saved


def get_profile(backends: ProfileBackends, refresh: bool = False, show: bool = True, compare: bool = False) -> tuple[Profile, bool]:
    """(profile, reused): the saved one while it is current and has the wanted backends' curves, else
    measured (what is missing, or everything with `refresh`) and saved. `curves` are the loaded ones'."""
    saved = None if refresh else load_profile(machine_facts(home()), backends)
    if saved is None:
        profile, reused = measure_profile(backends, show=show, compare=compare), False
    else:
        profile, reused = saved, not measure_backends(saved, backends, show, compare)
    if backends.target_name not in profile.targets or backends.drafter_name not in profile.drafters:
        raise OndeviceError(f"could not profile the loaded backends: {'; '.join(profile.skipped.values())}")
    profile.curves = profile.curves_for(backends.target_name, backends.drafter_name)
    if not reused:
        save_profile(profile)
    return profile, reused
