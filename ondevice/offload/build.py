"""Put a stack of decoder blocks where a `Placement` says — the few calls a target makes:

    layouts   = gguf_layouts(model.layers, gguf_path, gguf_names_from_table(table))  # or param_layouts(…)
    placement = plan_for(layouts, resident_bytes, device="cuda")    # budgets default to free memory
    streamer  = offload_blocks(model.layers, placement, "cuda", layouts, model_path=gguf_path)

Resident layers move to the device. Streamed layers get their host buffer (pinned on CUDA): read
from the model file (GGUF layouts) or packed from the loaded parameters (raw / group-wise); with
`check`, each buffer is unpacked once on the host and compared with the loaded parameters
(torch.equal), so a streamed layer provably computes with the weights a resident one would.
Streamed layers' buffers (e.g. a KV cache) move to the device; their parameters become meta tensors.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from ondevice.offload.disk import DiskReader, close_all, open_parts, read_ranges
from ondevice.offload.layout import (
    LayerLayout,
    check_unpacks_to_params,
    gguf_tensor_index,
    layout_from_gguf,
    layout_from_params,
    move_buffers,
    pack_params,
)
from ondevice.offload.encoded import EncodedLayers
from ondevice.offload.placement import Placement, plan_placement
from ondevice.offload.streamer import LayerStreamer, StreamedLayer
from ondevice.quant.groupwise import GroupSpec


def param_layouts(blocks: Sequence[nn.Module], spec: GroupSpec | None = None) -> dict[int, LayerLayout]:
    """Layouts of the blocks' loaded parameters: raw bytes, or group-wise codes with `spec`."""
    return {i: layout_from_params(block, spec) for i, block in enumerate(blocks)}


def gguf_layouts(
    blocks: Sequence[nn.Module],
    path: str,
    names: Callable[[int], Mapping[str, str]],
    unpermute: Callable[[int], Mapping[str, int]] | None = None,
) -> dict[int, LayerLayout]:
    """Layouts of the blocks as their GGUF tensors: names(i) maps block i's parameter names to GGUF
    tensor names; unpermute(i) gives Llama's Q/K head counts (see layout_from_gguf)."""
    index = gguf_tensor_index(path)
    return {
        i: layout_from_gguf(block, names(i), index, unpermute(i) if unpermute else None)
        for i, block in enumerate(blocks)
    }


def gguf_names_from_table(
    table: Mapping[str, str], block_prefix: str = "layers.{i}."
) -> Callable[[int], dict[str, str]]:
    """A `names` function for gguf_layouts from a {GGUF name: model name} table whose per-layer
    entries use "{i}" (like ondevice.targets.weights' table): block i's parameter → GGUF tensor.
    Entries for parameters a block does not have (e.g. Llama's missing biases) are ignored."""

    def names(i: int) -> dict[str, str]:
        prefix = block_prefix.format(i=i)
        pairs = ((ours.format(i=i), theirs.format(i=i)) for theirs, ours in table.items() if "{i}" in theirs)
        return {ours[len(prefix) :]: theirs for ours, theirs in pairs if ours.startswith(prefix)}

    return names


def plan_for(layouts: Mapping[int, LayerLayout], resident_bytes: int, **kwargs) -> Placement:
    """`plan_placement` with each layer's decoded and transferred sizes taken from its layout."""
    ordered = [layouts[i] for i in sorted(layouts)]
    return plan_placement(
        [layout.decoded_bytes for layout in ordered],
        resident_bytes,
        transfer_bytes=[layout.nbytes for layout in ordered],
        decode_scratch=not all(layout.zero_copy for layout in ordered),
        **kwargs,
    )


def offload_blocks(
    blocks: Sequence[nn.Module],
    placement: Placement,
    device: torch.device | str,
    layouts: Mapping[int, LayerLayout] | None = None,
    *,
    model_path: str | None = None,
    check: bool = True,
    disk_buffers: int = 2,
    trace: bool = False,
    timeout_s: float = 120.0,
) -> LayerStreamer | None:
    """Move resident blocks to the device (those kept encoded as their buffers, decoded for each
    pass: encoded.py) and stream the others; None when nothing streams."""
    device = torch.device(device)
    for i in placement.on_device:
        blocks[i].to(device)
    travelling = sorted(placement.streamed + placement.encoded_on_device)
    if not travelling:
        return None
    layouts = dict(layouts) if layouts is not None else {i: layout_from_params(blocks[i]) for i in travelling}
    from_file = [i for i in travelling if layouts[i].file_ranges]
    if (from_file or placement.from_disk) and model_path is None:
        raise ValueError("GGUF layouts and disk-tier layers need model_path")
    pin = device.type == "cuda"
    fds = open_parts(model_path) if from_file else []
    try:
        layers = [
            _host_layer(blocks[i], i, layouts[i], i in placement.from_ram, fds, pin, check) for i in placement.streamed
        ]
        kept = {i: _host_layer(blocks[i], i, layouts[i], True, fds, False, check).host.to(device) for i in placement.encoded_on_device}
    finally:
        close_all(fds)
    for i in placement.streamed:
        move_buffers(blocks[i], device)
    if kept:
        EncodedLayers(blocks, kept, layouts)  # its hooks hold the buffers as long as the blocks live
    if not placement.streamed:
        return None
    disk = None
    if placement.from_disk:
        disk = DiskReader(model_path, {i: layouts[i] for i in placement.from_disk}, disk_buffers, pin, timeout_s)
    return LayerStreamer(blocks, layers, device, placement.ring_slots, disk, trace, timeout_s)


def _host_layer(
    block: nn.Module, index: int, layout: LayerLayout, in_ram: bool, fds: list[int], pin: bool, check: bool
) -> StreamedLayer:
    """The layer's host buffer (RAM tier), filled and checked; disk-tier layers are only checked."""
    if not in_ram and not check:
        return StreamedLayer(index, layout, None)
    host = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=pin and in_ram)
    if layout.file_ranges:
        read_ranges(fds, layout.file_ranges, host)
    else:
        if not in_ram:
            raise ValueError(f"layer {index} cannot stream from disk: its layout has no file ranges")
        pack_params(block, layout, host)
    if check:
        check_unpacks_to_params(block, layout, host)
    return StreamedLayer(index, layout, host if in_ram else None)
