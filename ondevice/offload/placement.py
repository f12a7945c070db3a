"""Where each decoder layer of an offloaded target lives: on the device, in pinned RAM, or on disk.

Memory model (all in bytes):
  device  = resident minimum (embeddings, final norm, LM head, KV cache, activations margin)
          + the layers kept on the device: decoded, or (`keep_encoded`) as transferred, decoded
            again for every pass (offload/encoded.py)
          + when anything streams: `ring_slots` buffers of the largest layer as transferred
            + one decoded layer of scratch when layers travel encoded (GGUF blocks, int8, …)
  RAM     = every streamed layer as transferred (pinned) + `disk_buffers` staging buffers when any
            layer is read from disk.
Layers that do not fit on the device stream; streamed layers that do not fit in RAM come from disk.
Both kinds are spread evenly over the stack, so copies (and disk reads) overlap with the compute of
the layers around them.

Kept encoded, a Q4_K_M layer takes 0.28 of its bfloat16 size: where decoding a layer is much
faster than copying it in from pinned RAM (the Triton kernels of quant/gguf_triton.py on an H100:
docs/measurements/2026-11-27-gpu-h100.md), the room on the device holds 3.6 times as many layers
encoded as decoded, each one a copy fewer per pass. The target chooses it (targets/offloaded.py:
`keep_encoded` None = where the Triton kernels decode every tensor).

Sizes in budgets are read by `ondevice.sizes.parse_size` ("6GiB", "500MB", "1.5G").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import psutil
import torch

from ondevice.errors import OndeviceError
from ondevice.spread import spread, spread_layers
from ondevice.sizes import format_bytes, parse_size

DEVICE_MARGIN = 512 * 2**20  # left free on the GPU for the CUDA context, allocator slack
RAM_MARGIN = 2 * 2**30  # left free in RAM for the OS, Python and the drafter's working set


@dataclass(frozen=True)
class Placement:
    """The plan: layer indices per tier, and the memory each tier is planned to use."""

    on_device: tuple[int, ...]
    from_ram: tuple[int, ...]
    from_disk: tuple[int, ...]
    transfer_bytes: tuple[int, ...]  # per layer, as moved over the bus (encoded)
    device_bytes: int  # planned device memory, resident minimum included
    ram_bytes: int  # planned pinned host memory
    ring_slots: int = 2
    device_kind: str = "GPU"
    encoded_on_device: tuple[int, ...] = ()  # kept on the device as transferred, decoded for each pass

    @property
    def n_layers(self) -> int:
        return len(self.transfer_bytes)

    @property
    def streamed(self) -> tuple[int, ...]:
        """Streamed layers (RAM or disk) in the order a forward pass needs them."""
        return tuple(sorted(self.from_ram + self.from_disk))

    @property
    def bytes_per_pass(self) -> int:
        return sum(self.transfer_bytes[i] for i in self.streamed)

    @property
    def disk_bytes_per_pass(self) -> int:
        return sum(self.transfer_bytes[i] for i in self.from_disk)

    def describe(self) -> str:
        """'28 layers: 7 on GPU, 21 streamed from RAM, 0 from disk; 412 MB moved per pass'"""
        on_device = f"{len(self.on_device)} on {self.device_kind}, "
        if self.encoded_on_device:
            on_device = f"{len(self.encoded_on_device)} kept encoded on {self.device_kind}, "
            on_device += f"{len(self.on_device)} decoded, " if self.on_device else ""
        return (
            f"{self.n_layers} layers: {on_device}"
            f"{len(self.from_ram)} streamed from RAM, {len(self.from_disk)} from disk; "
            f"{format_bytes(self.bytes_per_pass)} moved per pass"
        )


def default_device_budget(device: torch.device | str) -> int:
    """Free device memory minus a margin (for a CPU 'device': available RAM minus a margin)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(0, free - DEVICE_MARGIN)
    return default_ram_budget()


def default_ram_budget() -> int:
    return max(0, psutil.virtual_memory().available - RAM_MARGIN)


def plan_placement(
    layer_bytes: Sequence[int],
    resident_bytes: int,
    *,
    transfer_bytes: Sequence[int] | None = None,
    device_budget: int | str | None = None,
    ram_budget: int | str | None = None,
    device: torch.device | str = "cuda",
    ring_slots: int = 2,
    disk_buffers: int = 2,
    decode_scratch: bool | None = None,
    keep_encoded: bool = False,
) -> Placement:
    """Plan which layers stay on the device, stream from RAM, or stream from disk.

    layer_bytes[i]: layer i's parameters as the device computes with them (decoded).
    transfer_bytes[i]: layer i as moved (GGUF blocks, int8 …); default: same as layer_bytes.
    resident_bytes: everything that must stay on the device whatever happens.
    decode_scratch: whether streamed layers are decoded into fresh memory (default: when the
    transferred and decoded sizes differ; f16 → bf16 is a decode of the same size).
    keep_encoded: layers that stay on the device stay as transferred (where that is smaller) and
    are decoded for every pass, like streamed ones; the caller knows whether decoding is fast.
    """
    n = len(layer_bytes)
    transfer = tuple(int(b) for b in (transfer_bytes if transfer_bytes is not None else layer_bytes))
    if len(transfer) != n:
        raise ValueError("layer_bytes and transfer_bytes must have one entry per layer")
    kind = "GPU" if torch.device(device).type == "cuda" else "CPU"
    budget = parse_size(device_budget) if device_budget is not None else default_device_budget(device)
    ram = parse_size(ram_budget) if ram_budget is not None else default_ram_budget()

    if resident_bytes + sum(layer_bytes) <= budget:  # everything fits: nothing streams
        return Placement(tuple(range(n)), (), (), transfer, resident_bytes + sum(layer_bytes), 0, ring_slots, kind)

    if decode_scratch is None:
        decode_scratch = transfer != tuple(layer_bytes)
    scratch = max(layer_bytes) if decode_scratch else 0
    floor = resident_bytes + ring_slots * max(transfer) + scratch
    if budget < floor:
        raise OndeviceError(
            f"The {kind} memory budget ({format_bytes(budget)}) is below the {format_bytes(floor)} this model "
            f"needs on the {kind} even with every layer streamed; free {kind} memory, raise the budget, "
            "or use a shorter context."
        )
    encoded = keep_encoded and sum(transfer) < sum(layer_bytes)
    kept = spread_layers(transfer if encoded else layer_bytes, budget - floor)  # the most layers, evenly spread, that fit
    on_device, encoded_on_device = ((), tuple(kept)) if encoded else (tuple(kept), ())
    streamed = [i for i in range(n) if i not in kept]
    from_ram, from_disk, ram_used = _split_ram_disk(streamed, transfer, ram, disk_buffers) if streamed else ([], [], 0)
    device_used = floor + sum((transfer if encoded else layer_bytes)[i] for i in kept)
    return Placement(
        on_device, tuple(from_ram), tuple(from_disk), transfer, device_used, ram_used, ring_slots, kind, encoded_on_device
    )


def _split_ram_disk(
    streamed: list[int], transfer: Sequence[int], ram: int, disk_buffers: int
) -> tuple[list[int], list[int], int]:
    """Streamed layers → (from RAM, from disk, RAM used); disk layers cost `disk_buffers` staging buffers."""
    all_in_ram = sum(transfer[i] for i in streamed)
    if all_in_ram <= ram:
        return streamed, [], all_in_ram
    staging = disk_buffers * max(transfer[i] for i in streamed)
    if ram < staging:
        raise OndeviceError(
            f"The RAM budget ({format_bytes(ram)}) is below the {format_bytes(staging)} needed to stream "
            "layers from disk; free some memory or raise the RAM budget."
        )
    for count in range(len(streamed) - 1, -1, -1):
        in_ram = spread(streamed, count)
        used = staging + sum(transfer[i] for i in in_ram)
        if used <= ram:
            return in_ram, [i for i in streamed if i not in in_ram], used
    raise AssertionError("unreachable: zero layers in RAM always fits once staging fits")
