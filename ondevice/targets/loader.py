"""Opening a target: the backend's class, given the context, the threads and (llama.cpp) the memory
plan's sizes.

`loading/choices.plan_load` chooses the backend and plans the memory; this file only opens what it chose.
"""

from __future__ import annotations

from pathlib import Path

from ondevice.decode.protocols import MAX_BUDGET
from ondevice.targets.llama_target import LlamaTarget


def load_target(backend: str, path: Path, n_ctx: int, threads: int, sized: dict | None = None, device: str | None = None,
                gpu_memory: str | None = None, ram_memory: str | None = None, cpu_max_tree: int = MAX_BUDGET):
    """The target on `backend`, "llama" or "torch" (the ONNX target is onnx/target.py's, a floor
    above). A llama.cpp target is sized and placed as `sized` says (the memory plan's
    `llama_target_sizes`; None: llama.cpp's defaults); a torch one goes to `device` (default: cuda if
    there is one) and, on a GPU or within the budgets, has its layers placed by the offloader for
    passes of up to MAX_BUDGET tokens on a GPU, `cpu_max_tree` on a CPU."""
    if backend == "llama":
        return LlamaTarget(path, n_ctx=n_ctx, threads=threads, **(sized or {}))
    import torch  # lazy: torch (~1 s) only for the torch target

    from ondevice.targets.torch_target import TorchTarget  # lazy: imports torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") or gpu_memory or ram_memory:  # place layers within the budgets
        from ondevice.targets.offloaded import load_offloaded_target  # lazy: imports torch

        return load_offloaded_target(path, device, n_ctx=n_ctx, threads=threads, gpu_memory=gpu_memory, ram_memory=ram_memory,
                                     max_tree=MAX_BUDGET if device.startswith("cuda") else cpu_max_tree)
    return TorchTarget.from_gguf(path, device=device, n_ctx=n_ctx, threads=threads)
