"""This machine: facts (CPU, SIMD, RAM, GPUs, disk) and measurements (memory, PCIe and disk
bandwidth; latency curves of the target and the drafter), the inputs of the optimizer.

Curves are measured, never assumed: a bf16 forward pass over 16 tokens costs the same as one token
on a CPU with AMX and 3× more on one without; an offloaded target costs ~1.5 s at 1 or 1,000 tokens.
torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ondevice.protocols import MAX_BUDGET
from ondevice.tree import DraftTree

GiB = 1 << 30
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


# --- facts ------------------------------------------------------------------------------------
@dataclass
class GpuFacts:
    name: str
    vram_total: int  # bytes
    vram_free: int  # bytes, when measured
    capability: str  # e.g. "8.9"


@dataclass
class MachineFacts:
    cpu_model: str
    physical_cores: int
    logical_cores: int
    usable_cores: int  # this process's CPU affinity (containers often get fewer than the machine has)
    simd: list[str]
    ram_total: int  # bytes
    ram_available: int  # bytes, when measured
    gpus: list[GpuFacts] = field(default_factory=list)
    disk_free: int = 0  # bytes free where ondevice keeps its files

    def fingerprint(self) -> str:
        """What the measurements depend on; volatile numbers (free RAM, free disk) are left out."""
        stable = [self.cpu_model, self.physical_cores, self.logical_cores, self.usable_cores, self.ram_total // GiB]
        stable += [(g.name, g.vram_total // GiB, g.capability) for g in self.gpus]
        return hashlib.sha256(repr(stable).encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, d: dict) -> "MachineFacts":
        return cls(**{**d, "gpus": [GpuFacts(**g) for g in d.get("gpus", [])]})


def _cpuinfo() -> dict[str, str]:
    """First processor's fields from /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
    return info


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch (~200 MB) where no GPU driver is present:
    on Linux without the NVIDIA (/proc/driver/nvidia) or ROCm (/dev/kfd) kernel driver, and on macOS."""
    if sys.platform == "darwin":
        return False
    if sys.platform.startswith("linux") and not (Path("/proc/driver/nvidia").exists() or Path("/dev/kfd").exists()):
        return False
    import torch

    return torch.cuda.is_available()


def gpu_facts() -> list[GpuFacts]:
    if not cuda_available():
        return []
    import torch

    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(GpuFacts(props.name, int(total), int(free), f"{props.major}.{props.minor}"))
    return gpus


def usable_cores() -> int:
    """Logical CPUs this process may run on (its affinity mask: taskset, cgroups, containers)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else psutil.cpu_count() or 1


def physical_cores() -> int:
    """Physical cores this process may use (hyper-threads of a busy core are not cores to spare)."""
    usable = usable_cores()
    return max(1, min(psutil.cpu_count(logical=False) or usable, usable))


def default_threads() -> int:
    """Compute threads: physical cores, but never more than the CPUs this process may use
    (llama.cpp and torch gain nothing from hyper-threads and lose a lot to oversubscription)."""
    return physical_cores()


def machine_facts(data_dir: Path | None = None) -> MachineFacts:
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    vm = psutil.virtual_memory()
    usable = usable_cores()
    disk_dir = data_dir if data_dir is not None and data_dir.exists() else Path.home()
    return MachineFacts(
        cpu_model=info.get("model name") or platform.processor() or platform.machine(),
        physical_cores=psutil.cpu_count(logical=False) or usable,
        logical_cores=psutil.cpu_count(logical=True) or usable,
        usable_cores=usable,
        simd=[f for f in SIMD_FLAGS if f in flags],
        ram_total=int(vm.total),
        ram_available=int(vm.available),
        gpus=gpu_facts(),
        disk_free=int(psutil.disk_usage(str(disk_dir)).free),
    )


# --- bandwidths -------------------------------------------------------------------------------
@dataclass
class Bandwidths:
    """GB/s (10^9 bytes per second). None: not measured (no GPU, no model file)."""

    ram_copy: float  # bytes read + written per second by a large memcpy
    host_to_device: float | None = None  # pinned RAM → GPU
    device_to_host: float | None = None  # GPU → pinned RAM
    disk_read: float | None = None  # sequential read of the model file, page cache dropped


def measure_ram_bandwidth(n_bytes: int | None = None, repeats: int = 3) -> float:
    """Best of `repeats` copies of an n_bytes buffer; a copy reads n and writes n bytes. Default:
    256 MB, or a sixteenth of the RAM this process may use when that is less (two buffers must not
    push a model that barely fits out of memory)."""
    if n_bytes is None:
        from ondevice.plan.ram import ram_budget

        n_bytes = min(256 << 20, max(32 << 20, ram_budget().bytes // 16))
    src = np.ones(n_bytes // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault in every page before timing
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def measure_pinned_bandwidth(n_bytes: int = 256 << 20, repeats: int = 3, device: int = 0) -> tuple[float, float]:
    """(host→device, device→host) GB/s through pinned memory, timed with CUDA events."""
    import torch

    host = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n_bytes, dtype=torch.uint8, device=f"cuda:{device}")

    def best_seconds(copy: Callable[[], None]) -> float:
        copy()  # warm-up
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return min(times)

    h2d = best_seconds(lambda: dev.copy_(host, non_blocking=True))
    d2h = best_seconds(lambda: host.copy_(dev, non_blocking=True))
    return n_bytes / h2d / 1e9, n_bytes / d2h / 1e9


def drop_page_cache(path: Path) -> bool:
    """Ask the kernel to forget the file's cached pages (flushed first: dirty pages can't be dropped)."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def measure_disk_read(path: Path, max_bytes: int = 1 * GiB, chunk: int = 16 << 20) -> float:
    """GB/s reading up to max_bytes of `path` sequentially after dropping it from the page cache.

    Where the cache can't be dropped (no posix_fadvise) the number may be RAM speed, not disk speed.
    """
    path = Path(path)
    drop_page_cache(path)
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while total < max_bytes:
            n = f.readinto(view[: min(chunk, max_bytes - total)])
            if not n:
                break
            total += n
    seconds = time.perf_counter() - t0
    drop_page_cache(path)  # leave no cached pages behind to flatter the next reader
    if total == 0:
        raise ValueError(f"{path} is empty")
    return total / seconds / 1e9


# --- latency curves ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LatencyCurve:
    """Seconds per call at measured sizes n (tokens per target pass, or draft batch size)."""

    ns: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.ns) == 0 or len(self.ns) != len(self.seconds) or list(self.ns) != sorted(set(self.ns)):
            raise ValueError("a latency curve needs increasing sizes, one time each")

    @property
    def max_n(self) -> int:
        return self.ns[-1]

    def __call__(self, n: float) -> float:
        """t(n): linear between measured points, flat below the first, last slope (≥ 0) beyond the last."""
        ns, ts = np.asarray(self.ns, dtype=np.float64), np.asarray(self.seconds, dtype=np.float64)
        if n <= ns[-1] or len(ns) == 1:
            return float(np.interp(n, ns, ts))
        slope = max(0.0, (ts[-1] - ts[-2]) / (ns[-1] - ns[-2]))
        return float(ts[-1] + slope * (n - ns[-1]))

    def padded(self) -> "LatencyCurve":
        """t(n) = min over measured n' ≥ n of t(n'): a call can always pad n tokens up to n', so a
        slower time at a smaller n is noise (another process took the CPU), not the machine."""
        envelope = np.minimum.accumulate(np.asarray(self.seconds)[::-1])[::-1]
        return LatencyCurve(self.ns, tuple(float(t) for t in envelope))

    def to_dict(self) -> dict:
        return {"ns": list(self.ns), "seconds": list(self.seconds)}

    @classmethod
    def from_dict(cls, d: dict) -> "LatencyCurve":
        return cls(tuple(int(n) for n in d["ns"]), tuple(float(t) for t in d["seconds"]))


@dataclass(frozen=True)
class Curves:
    """What the optimizer needs: a target pass vs tokens, and one draft call vs batch size."""

    target: LatencyCurve
    drafter: LatencyCurve

    def to_dict(self) -> dict:
        return {"target": self.target.to_dict(), "drafter": self.drafter.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Curves":
        return cls(LatencyCurve.from_dict(d["target"]), LatencyCurve.from_dict(d["drafter"]))


def powers_of_two(limit: int) -> tuple[int, ...]:
    return tuple(1 << i for i in range(limit.bit_length()) if 1 << i <= limit)


def pass_sizes(limit: int) -> tuple[int, ...]:
    """The target pass sizes a profile times: each power of two and the size just above it. llama.cpp's
    batched kernels work in tiles, so a pass costs a step function of its size (measured, AVX2, 2
    cores: 7 tokens 0.23 s, 8-16 0.43 s, 17-32 0.69 s, 33-48 0.95 s); a tree of 2^k nodes and one of
    2^k + 1 can differ by half, and a curve that only saw 2^k would call the second cheap."""
    return tuple(sorted({n for p in powers_of_two(limit) for n in (p, p + 1) if n <= limit}))


def _progress(show: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), disable=not show, transient=True,
    )


def _time_calls(label: str, sizes: Sequence[int], call: Callable[[int], None], repeats: int, show: bool) -> LatencyCurve:
    """Best of `repeats` calls at each size (other processes only ever add time), after one warm-up
    call at the smallest size; made non-decreasing in n (`padded`)."""
    call(sizes[0])
    seconds = []
    with _progress(show) as progress:
        task = progress.add_task(label, total=len(sizes))
        for n in sizes:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                call(n)
                times.append(time.perf_counter() - t0)
            seconds.append(min(times))
            progress.advance(task)
    return LatencyCurve(tuple(sizes), tuple(seconds)).padded()


def measure_target_curve(
    target, ns: Sequence[int] | None = None, context_tokens: int = 64, repeats: int = 2, show: bool = True,
    label: str = "target pass vs tokens",
) -> LatencyCurve:
    """Target pass latency vs tree size: forward_tree over a chain of n nodes on a short context.

    The target's cache is left as it was found (the context and each tree are truncated away).
    """
    start = target.n_cached
    room = target.n_ctx - start - context_tokens
    if room < 1:
        raise ValueError(f"the target's context ({target.n_ctx}) has no room to measure in")
    ns = tuple(n for n in (ns or pass_sizes(MAX_BUDGET)) if n <= room) or (1,)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, min(target.n_vocab, 32000), size=context_tokens + max(ns)).tolist()
    target.prefill(tokens[:context_tokens])
    base = target.n_cached

    def one_pass(n: int) -> None:  # n tree nodes: the root and a chain of n − 1 drafts
        target.forward_tree(DraftTree.chain(tokens[context_tokens], tokens[context_tokens + 1 : context_tokens + n]))
        target.commit([0])
        target.truncate(base)

    try:
        return _time_calls(label, ns, one_pass, repeats, show)
    finally:
        target.truncate(start)


def measure_drafter_curve(
    decode_batch: Callable[[int], None], batch_sizes: Sequence[int] = powers_of_two(128), repeats: int = 3, show: bool = True,
    label: str = "draft call vs batch",
) -> LatencyCurve:
    """Drafter latency of one decode call vs batch size; `decode_batch(n)` runs one call of n tokens
    (and undoes its cache effects), e.g. LlamaDrafter's."""
    return _time_calls(label, tuple(batch_sizes), decode_batch, repeats, show)
