"""A `TorchTarget` larger than its device: some decoder layers resident, the others streamed.

    target = load_offloaded_target("model.gguf", "cuda", gpu_memory="6GiB", ram_memory="2GiB")
    target.placement_summary()  # '28 layers: 7 on GPU, 21 streamed from RAM, 0 from disk; …'

Embeddings, final norm, LM head and the KV cache always stay on the device; `plan_placement`
decides which layers fit beside them. Streamed layers travel as their GGUF blocks, exactly the
bytes of the file, and are dequantized on the device after each transfer (`layout.unpack`); they are
never dequantized on the host. The blocks decode bit-identically to gguf's numpy dequantizer, so the
target computes what `TorchTarget.from_gguf` of the same file and dtype computes: the same logits.

Everything that can fail on the user's input (missing file, budget below the resident minimum, RAM
below the disk tier's staging) fails in `plan_offload`, before any tensor is dequantized, as one
line of OndeviceError; so does a file that vanishes later, when its layers are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ondevice.errors import OndeviceError
from ondevice.sizes import format_bytes, parse_size
from ondevice.offload.build import gguf_names_from_table, offload_blocks, plan_for
from ondevice.offload.encoded import decodes_fast
from ondevice.offload.layout import LayerLayout, gguf_tensor_index, layout_from_gguf
from ondevice.offload.placement import Placement
from ondevice.targets import weights
from ondevice.files.architecture import GGUF_NAMES, ModelArgs, gguf_model_args
from ondevice.targets.torch_model import Transformer, rope_inv_freq
from ondevice.targets.torch_target import PREFILL_CHUNK, TorchTarget, default_dtype, set_threads

LAYER_NAMES = gguf_names_from_table(GGUF_NAMES)  # block i's parameter → its GGUF tensor


@dataclass
class OffloadPlan:
    path: Path
    reader: object  # gguf_reader.SplitReader of path (all parts of a split model)
    args: ModelArgs
    model: Transformer  # on the meta device: shapes and dtypes only
    layouts: dict[int, LayerLayout]  # layer → its GGUF blocks as transferred
    resident_bytes: int  # what stays on the device whatever the placement
    placement: Placement


def load_offloaded_target(
    path,
    device=None,
    dtype=None,
    n_ctx: int = 4096,
    threads: int | None = None,
    gpu_memory: str | None = None,
    ram_memory: str | None = None,
    *,
    head_dtype=torch.float32,
    max_tree: int = PREFILL_CHUNK,
    keep_encoded: bool | None = None,
) -> TorchTarget:
    """A GGUF (qwen2 or llama) as a TorchTarget on `device` within the memory budgets.

    device: "cuda" / "cpu" (default: cuda when available; on "cpu" the budget is CPU memory and the
    streaming runs the same way, through a copy thread). dtype, head_dtype, threads: as
    `TorchTarget.from_gguf`. gpu_memory: the device budget ("6GiB"; default: free memory minus a
    margin); ram_memory: host memory for streamed layers, the rest streams from disk (on a CPU with
    no gpu_memory: all the memory the target may use, `cpu_budgets`) (default:
    available RAM minus a margin). max_tree: the largest draft tree verified in one pass (its
    logits and attention scores are part of the resident minimum). keep_encoded: layers that stay
    on the device stay as GGUF blocks, decoded for each pass (placement.py; default: where the
    Triton kernels decode them, offload/encoded.py).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or default_dtype(device)
    set_threads(threads)
    plan = plan_offload(path, device, dtype, n_ctx, gpu_memory, ram_memory, head_dtype=head_dtype, max_tree=max_tree,
                        keep_encoded=keep_encoded)  # fmt: skip
    model, placement = plan.model, plan.placement

    def keep(name: str) -> bool:  # only what stays on the device is dequantized here
        return not name.startswith("layers.") or int(name.split(".")[1]) in placement.on_device

    # each tensor goes to the device as soon as it is dequantized: host memory holds one at a time
    tensors = weights.iter_gguf_weights(plan.reader, plan.args, dtype, head_dtype, keep)
    loaded = {name: w.to(device) for name, w in tensors}
    assign_resident(model, loaded, placement)
    model.inv_freq = rope_inv_freq(plan.args).to(device)
    try:
        streamer = offload_blocks(model.layers, placement, device, plan.layouts, model_path=str(plan.path), check=False)
    except (OSError, EOFError) as err:  # the file vanished or shrank since it was planned
        why = getattr(err, "strerror", None) or err
        raise OndeviceError(f"Cannot read the layers to stream from {plan.path} ({why}): download it again.") from err
    target = TorchTarget(model, n_ctx)
    target.placement, target.streamer = placement, streamer
    return target


def plan_offload(
    path, device, dtype, n_ctx: int, gpu_memory, ram_memory, *, head_dtype=torch.float32, max_tree: int = PREFILL_CHUNK,
    keep_encoded: bool | None = None,
) -> OffloadPlan:
    """Where each layer goes, from the file's metadata alone (nothing is dequantized)."""
    path = Path(path).expanduser()
    reader = weights.open_gguf(path)
    args, _ = weights.untie_for_head_dtype(gguf_model_args(reader), dtype, head_dtype)
    try:
        model, layouts = meta_layouts(args, dtype, head_dtype, gguf_tensor_index(reader))
    except ValueError as err:  # a tensor missing or of the wrong shape
        raise OndeviceError(f"{path} does not match a {args.arch} model ({err}): download it again.") from err
    resident, placement = place_layers(model, layouts, device, dtype, n_ctx, gpu_memory, ram_memory, max_tree, keep_encoded)
    return OffloadPlan(path, reader, args, model, layouts, resident, placement)


def meta_layouts(args: ModelArgs, dtype, head_dtype, index) -> tuple[Transformer, dict[int, LayerLayout]]:
    """The model on the meta device (shapes and dtypes only) and each layer's layout as its GGUF
    tensors (`index`: name → where and how each is stored); ValueError if a tensor is missing."""
    with torch.device("meta"):
        model = Transformer(args).to(dtype)
    if model.output is not None:
        model.output.to(head_dtype)
    unpermute = args.gguf_permuted_rows()
    return model, {i: layout_from_gguf(block, LAYER_NAMES(i), index, unpermute) for i, block in enumerate(model.layers)}


def place_layers(
    model: Transformer, layouts: dict[int, LayerLayout], device, dtype, n_ctx: int, gpu_memory, ram_memory, max_tree: int,
    keep_encoded: bool | None = None,
) -> tuple[int, Placement]:
    """(resident bytes, placement) of the layers within the budgets (see `load_offloaded_target`)."""
    resident = _resident_bytes(model, model.args, dtype, n_ctx, max_tree)
    keep_encoded = decodes_fast(layouts, device) if keep_encoded is None else keep_encoded
    if torch.device(device).type == "cpu" and gpu_memory is None and ram_memory is not None:
        total = parse_size(ram_memory)
        gpu_memory, ram_memory = cpu_budgets(layouts, total)
        try:
            return resident, plan_for(layouts, resident, device=device, device_budget=gpu_memory, ram_budget=ram_memory,
                                      keep_encoded=keep_encoded)  # fmt: skip
        except OndeviceError:  # say it in the user's terms: the whole budget, the whole need
            need = resident + 2 * max(layout.nbytes for layout in layouts.values()) + max(layout.decoded_bytes for layout in layouts.values())
            raise OndeviceError(
                f"--ram-memory {format_bytes(total)} is below the {format_bytes(need + total - gpu_memory)} this target needs in RAM "
                "even with every layer streamed from disk (embeddings, LM head, KV cache, buffers); raise it or use a shorter --ctx."
            ) from None
    return resident, plan_for(layouts, resident, device=device, device_budget=gpu_memory, ram_budget=ram_memory, keep_encoded=keep_encoded)


def cpu_budgets(layouts, ram: int, disk_buffers: int = 2) -> tuple[int, int]:
    """(device, RAM tier) budgets for a target on a CPU given one RAM budget for all of it: the CPU is
    the device, so a separate RAM tier would hold a second copy of the same layers in the same
    memory. It gets just the disk tier's staging buffers; every layer that does not fit streams from
    disk, and the budget means what it says."""
    staging = disk_buffers * max(layout.nbytes for layout in layouts.values())
    return max(0, ram - staging), staging


def _resident_bytes(model: Transformer, args: ModelArgs, dtype, n_ctx: int, max_tree: int) -> int:
    """Embeddings, final norm, LM head, KV cache and the activations of the largest pass."""
    weights_bytes = sum(p.nbytes for name, p in model.named_parameters() if not name.startswith("layers."))
    item = dtype.itemsize
    kv_cache = 2 * args.n_layers * args.n_kv_heads * n_ctx * args.head_dim * item
    T = max(PREFILL_CHUNK, max_tree)  # tokens in one pass
    attention = 2 * args.n_heads * T * n_ctx * 4  # fp32 scores and probabilities, (nh, T, S)
    mlp = 3 * T * args.intermediate_size * item  # gate, up, their product
    stream = 8 * T * args.dim * 4  # residual, norms in fp32, q/k/v
    logits = T * args.vocab_size * 4  # fp32
    return weights_bytes + kv_cache + attention + mlp + stream + logits


def assign_resident(model: Transformer, loaded: dict[str, torch.Tensor], placement: Placement) -> None:
    """Put the dequantized tensors in the meta model; streamed layers and those kept encoded keep their meta parameters."""
    streamed = {f"layers.{i}." for i in placement.streamed + placement.encoded_on_device}
    expected = {name for name in model.state_dict() if not name.startswith(tuple(streamed))}
    missing, unexpected = expected - set(loaded), set(loaded) - expected
    if missing or unexpected:
        raise OndeviceError(
            f"The checkpoint does not match a {model.args.arch} model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}): the file may be damaged."
        )
    model.load_state_dict(loaded, strict=False, assign=True)
