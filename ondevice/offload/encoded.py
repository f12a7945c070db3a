"""Decoder layers kept on the device as they are transferred (GGUF blocks), decoded for every pass.

Where decoding is much cheaper than the copy it saves (the Triton kernels on an H100:
docs/measurements/2026-11-27-gpu-h100.md), the device's room holds more layers encoded than
decoded: 3.6 times as many at Q4_K_M in bfloat16 (placement.py).
Each such layer gets a forward pre-hook that decodes its buffer into the block's parameters and a
forward hook that drops them again, so one decoded layer at a time takes device memory (the
placement's decode scratch). The layer streamer never sees these layers: its copies of the next
streamed layer go on while they compute.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from gguf import GGMLQuantizationType as QT
from torch import nn

from ondevice.offload.layout import LayerLayout, free_params, move_buffers, point_params, unpack
from ondevice.quant.gguf_blocks import FLOAT_TYPES, fast_path_works


class EncodedLayers:
    def __init__(self, blocks: Sequence[nn.Module], buffers: Mapping[int, torch.Tensor], layouts: Mapping[int, LayerLayout]):
        """buffers[i]: layer i's bytes as transferred, already on the device (1-D uint8); the
        blocks' own buffers (a KV cache) move there too."""
        self.buffers = dict(buffers)
        self.hooks = []
        for i, buffer in self.buffers.items():
            block, layout = blocks[i], layouts[i]
            free_params(block, layout)
            move_buffers(block, buffer.device)
            self.hooks.append(block.register_forward_pre_hook(_decode_hook(buffer, layout)))
            self.hooks.append(block.register_forward_hook(_drop_hook(layout)))

    @property
    def nbytes(self) -> int:
        return sum(buffer.numel() for buffer in self.buffers.values())

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def _decode_hook(buffer: torch.Tensor, layout: LayerLayout):
    def pre_hook(block, args):
        point_params(block, unpack(buffer, layout))

    return pre_hook


def _drop_hook(layout: LayerLayout):
    def post_hook(block, args, output):
        free_params(block, layout)

    return post_hook


def decodes_fast(layouts: Mapping[int, LayerLayout], device: torch.device | str) -> bool:
    """Whether every GGUF-encoded tensor of these layers is decoded by a Triton kernel on `device`,
    each kernel checked there once (the other tensors are views or casts): then keeping layers
    encoded on the device pays."""
    device = torch.device(device)
    encoded = [t for layout in layouts.values() for t in layout.tensors if t.encoding != "raw"]
    blocks = [t for t in encoded if not (t.encoding == "gguf" and QT(t.qtype) in FLOAT_TYPES)]  # float ones: a cast
    if not blocks or any(t.encoding != "gguf" for t in blocks):
        return False
    return all(fast_path_works(qtype, device, dtype) for qtype, dtype in {(int(t.qtype), t.dtype) for t in blocks})
