"""Where a pair's target would live on this machine, as the loader would place it: in RAM or streamed
from disk (the memory plan), and on a GPU, which layers (the offload plan). `ondevice models` and
`ondevice models --predict` show it."""

from __future__ import annotations

from ondevice.catalog import hub
from ondevice.catalog.pairs import ModelFile, ModelPair
from ondevice.errors import OndeviceError
from ondevice.machine.ram import RamBudget
from ondevice.loading.footprint import ModelSize
from ondevice.loading.memory import plan_memory
from ondevice.decode.protocols import MAX_BUDGET
from ondevice.sizes import format_bytes
from ondevice.synthetic.quant_mix import preset_size
from ondevice.synthetic.shapes import find_shape
from ondevice.targets.page_cache import WINDOW_AHEAD


def target_place(pair: ModelPair, budget: RamBudget | None = None, n_ctx: int = 4096) -> str:
    """Where the pair's target would live here, by loading/memory.py: in RAM, or streamed from disk.
    Sizes from the downloaded files' headers, else from the catalog's shape preset and size."""
    try:
        target, drafter = model_size(pair.target), model_size(pair.drafter)
    except OndeviceError:  # a downloaded file whose header cannot be read: the listing goes on
        return "? (unreadable GGUF header)"
    if target is None:
        return "?"
    return place(target, drafter, budget, n_ctx)


def place(target: ModelSize, drafter: ModelSize | None, budget: RamBudget | None = None, n_ctx: int = 4096,
          tree_nodes: int | None = None) -> str:
    """Where a target of this size would live here beside this drafter, by the plan the loader makes
    (tree_nodes: the largest tree without a drafter model, as `loading/plan.plan_for` gives it)."""
    plan = plan_memory(target, drafter, n_ctx=n_ctx, budget=budget, ahead=WINDOW_AHEAD, tree_nodes=tree_nodes)  # as the loader plans it
    if plan.target_in_ram:
        return "fits in RAM"
    if plan.bytes_read_per_pass == 0:  # every layer kept: read once, then held in the page cache
        return "fits in RAM, mapped (nothing read per pass)"
    over = " (over budget: heavy paging)" if plan.over_budget else ""
    return f"streams from disk, {format_bytes(plan.bytes_read_per_pass)} per pass{over}"


def gpu_place(model: ModelFile, device: str = "cuda", gpu_memory: str | None = None, ram_memory: str | None = None,
              n_ctx: int = 4096) -> str:
    """How the torch target would place a downloaded target's layers on the GPU: the loader's own
    plan (target.offloaded.plan_offload, default budgets: free GPU memory and available RAM)."""
    if not hub.is_downloaded(model):
        return "planned once downloaded"
    import torch  # lazy: torch (~1 s), and the torch target's modules, only when a GPU is there to plan for

    from ondevice.targets.offloaded import plan_offload  # lazy: imports torch
    from ondevice.targets.torch_target import default_dtype  # lazy: imports torch

    try:
        plan = plan_offload(hub.local_path(model), device, default_dtype(torch.device(device)), n_ctx, gpu_memory, ram_memory, max_tree=MAX_BUDGET)
    except OndeviceError as err:  # an architecture the torch target does not run, a budget too small
        return str(err)
    return plan.placement.describe()


def model_size(model: ModelFile) -> ModelSize | None:
    """What the memory plan needs of a model: its GGUF header if downloaded, else its shape preset
    (every tensor's bytes in the quant mix, as the header will say) and the catalog's file size."""
    if hub.is_downloaded(model):
        return ModelSize.from_gguf(hub.local_path(model))
    if model.shape is None:
        return None
    return preset_size(find_shape(model.shape), model.size or model.approx_size)
