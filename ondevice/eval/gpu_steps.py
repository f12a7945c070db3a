"""The measuring steps of the GPU check (`python -m ondevice.eval.gpu_check`), each in its own process.

    python -m ondevice.eval.gpu_steps facts --out facts.json
    python -m ondevice.eval.gpu_steps bandwidth --out bw.json
    python -m ondevice.eval.gpu_steps model --shape llama-3.3-70b --role target --gpu-memory 24GB --seconds 150 --out t.json

A step writes one JSON object to --out. A process per step: a step that hangs or runs out of time
is killed without taking the others with it, and each synthetic model's memory (tens of GB of
pinned RAM at 70B) goes back to the machine before the next is built. `model` writes what it has
after building (placement, build time) and again after timing, so a step killed mid-way still
says how far it got. Nothing here imports llama.cpp; torch and the gguf package are imported only
by the steps that use them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil

from ondevice.machine.facts import measure_pinned_bandwidth
from ondevice.plan.curve import powers_of_two
from ondevice.plan.latency import TargetPasses
from ondevice.plan.timing import run_steps, timing_steps

TARGET_SIZES = powers_of_two(2048)  # tokens per target pass, as `ondevice bench --synthetic` times a GPU target
DRAFT_SIZES = powers_of_two(128)  # draft call vs batch, as `ondevice profile` times a drafter
TINY_TARGET_SIZES, TINY_DRAFT_SIZES = powers_of_two(64), powers_of_two(16)
CONTEXT_TOKENS = 64  # the context each timed pass attends to (latency.TargetPasses)


def check_shapes(tiny: bool) -> dict:
    """Name → ModelShape of the models the check measures: the presets, or (tiny, for a CPU) the
    same architectures, head tying and quant at a few layers and a small width."""
    from ondevice.synthetic.shapes import PRESETS  # lazy: reads GGUFs with the gguf package, only for the model steps

    names = ("qwen2.5-32b", "llama-3.3-70b", "qwen2.5-0.5b", "llama-3.2-1b")
    if not tiny:
        return {name: PRESETS[name] for name in names}
    small = {"qwen2.5-32b": (6, 384), "llama-3.3-70b": (8, 512), "qwen2.5-0.5b": (2, 256), "llama-3.2-1b": (2, 256)}
    return {
        name: dataclasses.replace(PRESETS[name], name=f"tiny-{name}", n_layers=small[name][0], dim=small[name][1],
                                  ffn=2 * small[name][1], n_heads=small[name][1] // 64, n_kv_heads=2, head_dim=64, vocab=2048)
        for name in names
    }  # fmt: skip


def facts() -> dict:
    """The machine and what is installed (versions, not yet any measurement)."""
    import torch  # lazy: torch only in the steps that use it (module docstring)

    cuda = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if cuda else None
    return {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": cuda,
        "gpu": props.name if props else None, "gpu_memory_bytes": props.total_memory if props else None,
        "cuda_version": torch.version.cuda, "cpu_count": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total,
        "cpu": platform.processor() or platform.machine(), "gguf": _version("gguf"),
        "llama_cpp": importlib.util.find_spec("llama_cpp") is not None,
    }  # fmt: skip


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def bandwidth() -> dict:
    """Pinned host↔device copy rates (1 GiB, best of 5), the peak a streamed pass can reach."""
    h2d, d2h = measure_pinned_bandwidth(1 << 30, repeats=5)
    return {"host_to_device_gbps": h2d, "device_to_host_gbps": d2h, "bytes": 1 << 30}


def time_model(shape, role: str, device: str, gpu_memory: str | None, seconds: float, out: Path, tiny: bool) -> dict:
    """Build the synthetic model (a target streamed within `gpu_memory`, or a drafter resident) and
    time passes vs tokens, stopping early enough to end within `seconds`."""
    from ondevice.synthetic.offloaded import offloaded_target  # lazy: torch and gguf, only in this step

    start = time.monotonic()
    sizes = (TINY_TARGET_SIZES if tiny else TARGET_SIZES) if role == "target" else (TINY_DRAFT_SIZES if tiny else DRAFT_SIZES)
    n_ctx = 256 if tiny else 4096
    if gpu_memory == "quarter":
        gpu_memory = quarter_budget(shape, device, n_ctx, max(sizes))
    target = offloaded_target(shape, device, gpu_memory, n_ctx=n_ctx, max_tree=max(sizes))
    _sync(device)
    record = {"shape": shape.name, "role": role, "device": device, "gpu_memory": gpu_memory, "n_ctx": n_ctx,
              "build_seconds": time.monotonic() - start, **placement_record(target)}  # fmt: skip
    write_json(out, {**record, "status": "timing"})
    passes = TargetPasses(target, CONTEXT_TOKENS, max(sizes))
    timing_start, deadline = time.monotonic(), start + seconds

    def enough(timing, n: int) -> bool:
        """Stop growing n when one more size (at most about twice this one) in both sweeps would end past the deadline."""
        first_sweep = time.monotonic() - timing_start + 2 * max(timing.seconds(n), 0.1)
        return timing_start + 2 * first_sweep + 5 > deadline

    timing = run_steps(timing_steps(sizes, passes, enough))
    passes.undo()
    ns = sorted(timing.samples)
    curve = timing.curve
    record |= {
        "ns": ns, "seconds": [timing.seconds(n) for n in ns], "curve_seconds": list(curve.seconds),
        "not_timed": [n for n in sizes if n not in timing.samples], "busy": timing.busy,
        "others_cores": timing.others_cores, **streamer_record(target, curve(ns[0])), "status": "ok",
    }  # fmt: skip
    target.close()
    return record


def quarter_budget(shape, device: str, n_ctx: int, max_tree: int) -> str:
    """A device budget that keeps about a quarter of the layers resident and streams the rest (the
    CPU path's stand-in for a GPU too small for the model)."""
    import torch  # lazy: torch and gguf only in the model steps (module docstring)

    from ondevice.synthetic.offloaded import model_args, virtual_index  # lazy: as torch
    from ondevice.synthetic.quant_mix import preset_tensors  # lazy: as torch
    from ondevice.targets.offloaded import meta_layouts, place_layers  # lazy: as torch

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model, layouts = meta_layouts(model_args(shape), dtype, torch.float32, virtual_index(preset_tensors(shape)))
    resident, _ = place_layers(model, layouts, device, dtype, n_ctx, str(1 << 50), str(1 << 50), max_tree)
    moved, decoded = max(lay.nbytes for lay in layouts.values()), max(lay.decoded_bytes for lay in layouts.values())
    return str(resident + 2 * moved + decoded + (shape.n_layers // 4) * decoded + decoded // 2)


def placement_record(target) -> dict:
    """Where the layers went, and what the pinned-memory allocator really holds beside what was planned."""
    import torch  # lazy: torch only in the model steps (module docstring)

    from ondevice.quant import gguf_triton  # lazy: as torch

    placement = target.placement
    stats = torch.cuda.host_memory_stats() if target.device.type == "cuda" and hasattr(torch.cuda, "host_memory_stats") else {}
    return {
        "placement": placement.describe(), "layers": placement.n_layers, "layers_on_device": len(placement.on_device),
        "layers_encoded_on_device": len(placement.encoded_on_device),
        "layers_streamed": len(placement.streamed), "bytes_per_pass": placement.bytes_per_pass,
        "planned_device_bytes": placement.device_bytes, "planned_host_bytes": placement.ram_bytes,
        "host_allocator_bytes": {k: v for k, v in stats.items() if "bytes" in k and k.endswith(".current")},
        "rss_bytes": psutil.Process().memory_info().rss,
        "device_allocated_bytes": torch.cuda.memory_allocated() if target.device.type == "cuda" else None,
        "dequantizer": gguf_triton.describe(target.device),
    }  # fmt: skip


def streamer_record(target, first_pass_seconds: float) -> dict:
    """What the streamer measured while the passes ran, and the bandwidth the smallest pass achieved."""
    if target.streamer is None:
        return {"copy_gbps": None, "achieved_gbps": None}
    stats = target.streamer.collect_stats()
    waited = sum(stats.wait_seconds.values()) / max(stats.passes, 1)
    return {
        "copy_gbps": stats.bandwidth / 1e9 if stats.bandwidth else None,
        "achieved_gbps": target.placement.bytes_per_pass / first_pass_seconds / 1e9,
        "compute_wait_seconds_per_pass": waited,
    }


def _sync(device: str) -> None:
    import torch  # lazy: torch only in the model steps (module docstring)

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def write_json(path: Path, record: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("facts", "bandwidth", "model"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", help="model step: a preset name (with --tiny: its small stand-in)")
    parser.add_argument("--role", choices=("target", "drafter"), default="target")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gpu-memory", help="model step, target: the device budget ('24GB'; 'quarter': a quarter of the layers)")
    parser.add_argument("--seconds", type=float, default=120.0, help="model step: end within this many seconds")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    if args.step == "facts":
        record = facts()
    elif args.step == "bandwidth":
        record = bandwidth()
    else:
        shape = check_shapes(args.tiny)[args.shape]
        record = time_model(shape, args.role, args.device, args.gpu_memory if args.role == "target" else None, args.seconds, args.out, args.tiny)
    write_json(args.out, record)


if __name__ == "__main__":
    main(sys.argv[1:])
