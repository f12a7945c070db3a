"""Opening a target: the backend's class, given the context, the threads and (llama.cpp) the memory plan.

`loading.plan_load` chooses the backend and plans the memory; this file only opens what it chose.
"""

from __future__ import annotations

from pathlib import Path

from ondevice.plan.auto import CPU_MAX_TREE
from ondevice.plan.memory import MemoryPlan
from ondevice.protocols import MAX_BUDGET


def largest_tree(on_gpu: bool) -> int:
    """The largest target pass to profile and place for: as many nodes as any draft may hold on a
    GPU; fewer on a CPU, where the pass cost grows steeply with the tree."""
    return MAX_BUDGET if on_gpu else CPU_MAX_TREE


def load_target(backend: str, path: Path, n_ctx: int, threads: int, memory: MemoryPlan | None = None, device: str | None = None,
                gpu_memory: str | None = None, ram_memory: str | None = None):
    """The target on `backend` ("llama", "onnx" or "torch"). A llama.cpp target is sized and placed
    by `memory` (None: llama.cpp's defaults); a torch one goes to `device` (default: cuda if there is
    one) and, on a GPU or within the budgets, has its layers placed by the offloader."""
    if backend == "llama":
        from ondevice.target.llama_target import LlamaTarget

        if memory is None:
            return LlamaTarget(path, n_ctx=n_ctx, threads=threads)
        return LlamaTarget(path, n_ctx=n_ctx, threads=threads, max_tree_nodes=memory.sizes.max_tree, n_ubatch=memory.sizes.target_ubatch,
                           streams=memory.streams, window=memory.ahead, kv_type=memory.kv_type, kept_layers=memory.kept_layers(memory.ahead))
    if backend == "onnx":
        from ondevice.target.onnx_target import OnnxTarget

        return OnnxTarget.from_gguf(path, n_ctx=n_ctx, threads=threads)
    import torch

    from ondevice.target.torch_target import TorchTarget

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") or gpu_memory or ram_memory:  # place layers within the budgets
        from ondevice.offload.target import load_offloaded_target

        return load_offloaded_target(path, device, n_ctx=n_ctx, threads=threads, gpu_memory=gpu_memory, ram_memory=ram_memory,
                                     max_tree=largest_tree(device.startswith("cuda")))
    return TorchTarget.from_gguf(path, device=device, n_ctx=n_ctx, threads=threads)
