"""This machine: facts (CPU, SIMD, RAM, GPUs, disk) and bandwidths (memory, PCIe, disk), inputs
of the planner beside the latency curves (`ondevice.plan.latency`). torch is imported only inside
the functions that need it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import psutil

from ondevice.machine.ram import ram_budget


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
    import torch  # lazy: torch (~200 MB, ~1 s) only where a GPU driver is present

    return torch.cuda.is_available()


def gpu_facts() -> list[GpuFacts]:
    if not cuda_available():
        return []
    import torch  # lazy: torch only where a GPU driver is present

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
    import torch  # lazy: torch only on a machine with a GPU to measure

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
