"""Measure a synthetic model on this machine: pass time vs tokens, bytes per pass, bandwidth.

    m = measure(model, LoadOptions(), ns=(1, 4, 16))   # writes the GGUF, measures, removes it

The target runs through the pipeline's own loader (`load_plan.load_model_file`): the backend and
placement a real model of that shape would get (llama.cpp resident; torch resident, streamed
RAM→GPU under --gpu-memory, or from disk under --ram-memory). The bandwidth it is compared with is
measured in the same run with the profile's functions (ondevice.machine.facts): disk read of the
synthetic file (before any backend maps it), RAM copy, pinned host→device on a GPU.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import psutil

from ondevice.catalog.stores.derived import repacked_paths
from ondevice.loading import plan as load_plan
from ondevice.errors import OndeviceError
from ondevice.offload.placement import RAM_MARGIN
from ondevice.paths import home
from ondevice.loading.options import LoadOptions
from ondevice.plan.auto import CPU_MAX_TREE
from ondevice.decode.protocols import MAX_BUDGET
from ondevice.sizes import format_bytes
from ondevice.loading.footprint import ModelSize
from ondevice.loading.memory import MemoryPlan
from ondevice.machine.ram import own_cgroup_memory
from ondevice.machine.facts import Bandwidths, machine_facts, measure_disk_read, measure_pinned_bandwidth, measure_ram_bandwidth
from ondevice.plan.curve import LatencyCurve, pass_sizes, powers_of_two
from ondevice.plan.latency import measure_drafter_timing, measure_target_curve, measure_target_timing
from ondevice.synthetic.cache import SyntheticMeasurement, Traffic, save_measurement
from ondevice.synthetic.pass_meter import PassMeter, pass_counters
from ondevice.synthetic.quant_mix import file_bytes, preset_size
from ondevice.synthetic.sources import SyntheticModel
from ondevice.synthetic.writer import write_synthetic_gguf

DRAFT_BATCHES = powers_of_two(128)  # as `ondevice profile` measures the drafter


def models_dir() -> Path:
    return home() / "synthetic" / "models"


def budgets_label(opts: LoadOptions) -> str:
    """The memory budgets a measurement ran under, as it is cached and looked up: --gpu-memory,
    --ram-memory, else the limit of the cgroup it runs in (a 7B streamed under 3.5 GB is not the
    7B in RAM)."""
    budgets = [(name, size) for name, size in (("gpu", opts.gpu_memory), ("ram", opts.ram_memory)) if size]
    limit = cgroup_limit()
    if not opts.ram_memory and limit is not None:
        budgets.append(("cgroup", format_bytes(limit)))
    return ", ".join(f"{name} {size}" for name, size in budgets)


def cgroup_limit() -> int | None:
    """The memory limit of this process's cgroup, where it is below the machine's RAM (else None)."""
    cgroup = own_cgroup_memory()
    return cgroup.limit if cgroup is not None and cgroup.limit < psutil.virtual_memory().total else None


@contextmanager
def synthetic_file(model: SyntheticModel, seed: int, keep: bool, show: bool) -> Iterator[Path]:
    """The model's GGUF under <home>/synthetic/models: a kept one is reused, else written (and
    removed on exit unless `keep`, with the repacked copy a streaming load made of it)."""
    path = models_dir() / f"{model.shape.name}-seed{seed}.gguf"
    existed = path.exists()
    if not existed:
        write_synthetic_gguf(model.shape, path, seed, model.tensors, show=show)
    try:
        yield path
    finally:
        if not keep and not existed:
            for made in (path, *repacked_paths(path)):
                made.unlink(missing_ok=True)


def default_sizes(role: str, backend: str, memory: MemoryPlan | None = None) -> tuple[tuple[int, ...], str]:
    """(sizes to time, why they stop there)."""
    if role == "drafter":
        return DRAFT_BATCHES, "draft call vs batch, up to 128 (as `ondevice profile`)"
    if "cuda" in backend:
        return powers_of_two(MAX_BUDGET), ""
    if memory is not None and memory.sizes.max_tree < CPU_MAX_TREE:
        return pass_sizes(memory.sizes.max_tree), f"capped at {memory.sizes.max_tree} tokens: the largest tree the memory plan allows here"
    return pass_sizes(CPU_MAX_TREE), (
        f"capped at {CPU_MAX_TREE} tokens on a CPU target: a pass costs about n one-token steps here, "
        "so bigger trees never pay (--budgets to measure others)"
    )


def model_size(model: SyntheticModel) -> ModelSize:
    """What the memory plan needs of a synthetic model, from its tensor list (as `from_gguf` reads a file)."""
    return preset_size(model.shape, tensors=model.tensors)


def memory_plan(model: SyntheticModel, opts: LoadOptions, drafter: SyntheticModel | None = None) -> MemoryPlan | None:
    """The pipeline's memory plan for a llama.cpp target of this shape beside its drafter (None: not a llama.cpp target)."""
    if model.role != "target" or load_plan.pick_backend(opts.target_backend) != "llama":
        return None
    return load_plan.plan_for(model_size(model), model_size(drafter) if drafter else None, opts)


def measure(
    model: SyntheticModel, opts: LoadOptions, ns: Sequence[int] | None = None, seed: int = 0, keep: bool = False, show: bool = True,
    drafter: SyntheticModel | None = None,
) -> SyntheticMeasurement:
    """Write (or reuse) the synthetic GGUF, measure its curve on this machine, cache and return it.
    `drafter`: the pair's drafter, whose memory the plan of a llama.cpp target leaves room for.
    Timed as the planner times its profile (plan/timing.py: samples judged by what other processes
    used meanwhile, disturbed sizes sampled again): if some size never got a quiet sample, the
    machine was busy, and the measurement is returned with `busy_cores` set but not cached (a curve
    another job slowed would stand in every forecast: docs/measurements/code-notes.md).
    A drafter's curve is cached without the memory budgets (it is read into RAM under any of them,
    and forecasts look it up so); a target's under them."""
    facts = machine_facts(home())
    memory = memory_plan(model, opts, drafter)
    check_fits(model, opts, memory)  # before gigabytes are written
    with synthetic_file(model, seed, keep, show) as path:
        bandwidths = Bandwidths(measure_ram_bandwidth(), disk_read=measure_disk_read(path))  # disk first: before a backend maps it
        if facts.gpus:
            bandwidths.host_to_device, bandwidths.device_to_host = measure_pinned_bandwidth()
        backend, runner = load_plan.load_model_file(path, model.role, opts, memory)
        sizes, note = default_sizes(model.role, backend, memory)
        if ns:
            sizes, note = tuple(sorted(set(ns))), ""
        try:
            if model.role == "drafter":
                timing = measure_drafter_timing(runner.probe_batch, sizes, show=show)
                placement, traffic = "on CPU (llama.cpp drafter)", _resident_traffic(model, bandwidths, "RAM")
            else:
                meter = PassMeter(runner, pass_counters(path))  # what each pass read from storage, beside the plan's prediction
                timing, _ = measure_target_timing(meter, sizes, show=show, prune=False)
                placement, traffic = where_it_ran(runner, model, bandwidths, memory)
        finally:
            runner.close()
            del runner
            gc.collect()
    result = SyntheticMeasurement(
        model.shape.name, model.role, backend, budgets_label(opts) if model.role == "target" else "", placement, timing.curve, traffic, file_bytes(list(model.tensors)),
        seed, note, busy_cores=round(timing.others_cores, 2) if timing.busy else None,
        per_pass=meter.summary() if model.role == "target" else None, memory=memory.to_dict() if memory is not None else None,
    )
    if result.busy_cores is None:  # a curve another process slowed would stand for this shape until re-measured
        save_measurement(facts.fingerprint(), result)
    return result


def busy_line(m: SyntheticMeasurement) -> str | None:
    """The line that says a measurement was not cached (None: it was)."""
    if m.busy_cores is None:
        return None
    return f"the machine was busy (others used ~{m.busy_cores:.1f} cores): not cached; run again when it is quiet"


def check_fits(model: SyntheticModel, opts: LoadOptions, memory: MemoryPlan | None) -> None:
    """Refuse, in one line and before anything is written, what would push every other process out
    of memory (or be killed): a llama.cpp target whose memory plan has no room even to stream, a
    drafter bigger than the RAM, or the torch target on a CPU without a budget (it dequantizes every
    weight to fp32). A placement under --gpu-memory / --ram-memory plans for itself."""
    import torch  # lazy: torch (~1 s) only to ask whether a GPU is there

    room = psutil.virtual_memory().available - RAM_MARGIN
    on_cpu = not torch.cuda.is_available() and (opts.device or "cpu").startswith("cpu")
    if memory is not None:
        if memory.over_budget:
            raise OndeviceError(f"the synthetic {model.shape.name} would page heavily here ({memory.describe()}); measure it on a machine with more memory.")
        return
    if model.role == "drafter":
        backend, size = "llama.cpp", file_bytes(list(model.tensors))
    elif load_plan.pick_backend(opts.target_backend) == "torch" and on_cpu and not (opts.gpu_memory or opts.ram_memory):
        backend, size = "the torch target", 4 * model.shape.parameters()
    else:
        return
    if size > room:
        raise OndeviceError(
            f"the synthetic {model.shape.name} needs {format_bytes(size)} of RAM as {backend} runs it here, more than is available "
            f"({format_bytes(max(room, 0))} after a {format_bytes(RAM_MARGIN)} margin); measure it with --target-backend llama "
            "(the memory plan streams it from disk), or with a --ram-memory budget for the torch target."
        )


def where_it_ran(target, model: SyntheticModel, bw: Bandwidths, memory: MemoryPlan | None = None) -> tuple[str, Traffic]:
    """(placement in words, the bytes a pass reads from its slowest tier and that tier's bandwidth)."""
    if memory is not None:  # llama.cpp: in RAM, or streamed from disk through the page cache
        if memory.streams:
            return memory.describe(), Traffic(memory.bytes_read_per_pass, "disk", "disk read", bw.disk_read)
        return memory.describe(), _resident_traffic(model, bw, "RAM")
    placement = getattr(target, "placement", None)
    if not hasattr(target, "placement_summary"):  # a target that plans nothing: every weight read from RAM each pass
        return "all layers on CPU", _resident_traffic(model, bw, "RAM")
    summary = target.placement_summary()
    stats = target.streamer.collect_stats() if getattr(target, "streamer", None) is not None else None
    copy = stats.bandwidth / 1e9 if stats and stats.bandwidth else None
    if placement is None or not placement.streamed:
        on_gpu = target.device.type == "cuda"
        weights = sum(p.nbytes for name, p in target.model.named_parameters() if "tok_embeddings" not in name)
        return summary, Traffic(weights, "GPU memory" if on_gpu else "RAM", "—" if on_gpu else "RAM copy", None if on_gpu else bw.ram_copy)
    if placement.from_disk:
        return summary, Traffic(placement.disk_bytes_per_pass, "disk", "disk read", bw.disk_read, copy)
    if placement.device_kind == "GPU":
        return summary, Traffic(placement.bytes_per_pass, "pinned RAM → GPU", "pinned → GPU", bw.host_to_device, copy)
    return summary, Traffic(placement.bytes_per_pass, "RAM", "RAM copy", bw.ram_copy, copy)


def _resident_traffic(model: SyntheticModel, bw: Bandwidths, source: str) -> Traffic:
    """Every weight matrix is read once per pass; the embedding table only at the rows looked up."""
    skip = "token_embd.weight" if not model.shape.tied else ""
    return Traffic(sum(t.nbytes for t in model.tensors if t.name != skip), source, "RAM copy", bw.ram_copy)


def compare_with_real(
    model: SyntheticModel, opts: LoadOptions, ns: Sequence[int], seed: int = 0, rounds: int = 2, repeats: int = 3, show: bool = True
) -> tuple[LatencyCurve, LatencyCurve]:
    """(real, twin) target curves from one run, interleaved at every size: real, twin, real, twin
    (`rounds` times, `repeats` passes each), so a busy moment of the machine hits both alike; each
    point is the best pass of its target."""
    if model.real_file is None:
        raise ValueError("no real file to compare with")
    with synthetic_file(model, seed, keep=False, show=show) as path:
        plan = memory_plan(model, opts)  # the same plan for both: the twin has the real file's tensors
        _, real = load_plan.load_model_file(model.real_file, "target", opts, plan)
        _, twin = load_plan.load_model_file(path, "target", opts, plan)
        try:
            curves: dict[str, list[LatencyCurve]] = {"real": [], "twin": []}
            for _ in range(rounds):
                for n in ns:
                    for label, target in (("real", real), ("twin", twin)):
                        curves[label].append(measure_target_curve(target, [n], sweeps=repeats, show=False))
        finally:
            real.close()
            twin.close()
    return best_of(curves["real"], ns), best_of(curves["twin"], ns)


def best_of(points: list[LatencyCurve], ns: Sequence[int]) -> LatencyCurve:
    """One curve from single-size measurements: the fastest time seen at each size."""
    return LatencyCurve(tuple(ns), tuple(min(c.seconds[0] for c in points if c.ns[0] == n) for n in ns))
