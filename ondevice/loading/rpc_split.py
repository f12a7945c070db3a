"""The target's layers across this machine and RPC workers, placed by the memory each has.

    split = plan_split(ModelSize.from_gguf(target), local_room, [("10.0.0.2:50052", free)], n_ctx=4096)
    split.describe()  # 'target split: this machine layers 0-9 (390 MB), 10.0.0.2:50052 layers
                      #  10-27 + LM head (820 MB); the drafter stays on this CPU'

llama.cpp places a model by layer (llama-model.cpp, load_tensors): the input embeddings stay on
the CPU, the first n_layers + 1 - n_gpu_layers decoder layers on the CPU too, and the rest, the LM
head counted as one more layer after the last, go to the model's devices in order, device j taking
the slots its `tensor_split` share covers. So this machine holds the first layers and each worker a
run of the ones after; the last worker also computes the LM head and sends the logits back. Each
part's share is proportional to its room (what it offers less its buffers), in whole layers, each
with its KV cache. A pass then crosses the network once per part, both ways, plus the logits: a
cost per pass nearly independent of its tokens, as with a disk, and a slope (logits, n_vocab × 4
bytes a node) that the profile measures like any other pass.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass

import llama_cpp

from ondevice.errors import OndeviceError
from ondevice.loading.footprint import F32, ModelSize, context_buffers
from ondevice.loading.memory import MARGIN
from ondevice.rpc import library
from ondevice.sizes import format_bytes

LOCAL = "this machine"
WORKER_SLACK = 64 << 20  # what a worker's allocator and graph bookkeeping add beyond the buffers counted


@dataclass(frozen=True)
class Part:
    """One place the target's layers live: this machine (first) or a worker's device."""

    name: str  # LOCAL or the worker's host:port
    room: int  # bytes it offers for layers and their KV cache (after its buffers; the last worker: after the LM head)
    layers: tuple[int, ...]
    head: bool  # holds and computes the LM head
    weight_bytes: int  # the layers' (and head's) bytes it holds

    def describe(self) -> str:
        span = "no layers" if not self.layers else f"layer{'s' if len(self.layers) > 1 else ''} {self.layers[0]}" + (
            f"-{self.layers[-1]}" if len(self.layers) > 1 else "")
        return f"{self.name} {span}{' + LM head' if self.head else ''} ({format_bytes(self.weight_bytes)})"


@dataclass
class RpcSplit:
    """Where each layer of a target split over RPC lives, and how llama.cpp is told so."""

    parts: tuple[Part, ...]  # this machine first, then each worker in --rpc order
    devices: tuple[int, ...]  # the workers' ggml devices, one per worker part
    n_layers: int
    kv_bytes_per_layer: int

    @property
    def workers(self) -> tuple[Part, ...]:
        return self.parts[1:]

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.workers)

    @property
    def key(self) -> str:
        """The profile's key suffix: one curve per split (the same workers holding the same layers)."""
        text = ";".join(f"{p.name}={len(p.layers)}" for p in self.parts)
        return "rpc-" + hashlib.sha256(text.encode()).hexdigest()[:8]

    @property
    def bytes_on_workers(self) -> int:
        return sum(p.weight_bytes for p in self.workers)

    def configure(self, params) -> None:
        """Set llama_model_params so llama.cpp places the layers as planned (load_model's hook)."""
        self._devices = (ctypes.c_void_p * (len(self.devices) + 1))(*self.devices, None)  # NULL-terminated
        shares = [len(p.layers) + p.head for p in self.workers]
        self._shares = (ctypes.c_float * llama_cpp.llama_max_devices())(*shares)  # llama.cpp copies max_devices floats
        params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        params.n_gpu_layers = sum(shares)
        params.split_mode = llama_cpp.LLAMA_SPLIT_MODE_LAYER
        params.tensor_split = self._shares

    def attach(self) -> None:
        """Once the model is loaded: a worker lost from now on ends the process with one line
        (faults.py), its connections time out rather than hang, and their traffic is counted."""
        from ondevice.rpc.faults import harden, install_abort_handler
        from ondevice.rpc.traffic import WorkerLinks

        install_abort_handler(self.endpoints)
        self.links = WorkerLinks(self.endpoints)
        for fds in self.links.fds.values():
            for fd in fds:
                harden(fd)

    def pass_starts(self) -> None:
        if getattr(self, "links", None) is not None:
            self.links.pass_starts()

    def pass_ends(self, tokens: int) -> None:
        if getattr(self, "links", None) is not None:
            self.links.pass_ends(tokens)

    def traffic(self) -> dict:
        """Bytes, TCP segments and round trips per verification pass so far (traffic.py)."""
        return self.links.summary() if getattr(self, "links", None) is not None else {}

    def describe(self) -> str:
        return "target split: " + ", ".join(p.describe() for p in self.parts) + "; the drafter stays on this CPU"

    def to_dict(self) -> dict:
        return {"parts": [{"where": p.name, "layers": list(p.layers), "lm_head": p.head, "weight_bytes": p.weight_bytes,
                           "room_bytes": p.room} for p in self.parts], "summary": self.describe(), "traffic": self.traffic()}


def worker_reserve(target: ModelSize, n_ctx: int, n_ubatch: int, max_tree: int) -> int:
    """What a worker needs besides its layers: the compute scratch of one ubatch over the context
    (the last worker's includes the logits), and slack."""
    return context_buffers(target, n_ctx, n_ubatch, max_tree).compute + WORKER_SLACK


def assign_layers(costs: list[int], rooms: list[int]) -> list[list[int]]:
    """Contiguous runs of layers, one per part, each part's share of the total proportional to its
    room (a layer goes where its middle falls), then moved on where a part would overflow."""
    total, room_sum = sum(costs), sum(rooms)
    bounds, acc = [], 0
    for r in rooms:
        acc += r
        bounds.append(total * acc / room_sum)
    runs: list[list[int]] = [[] for _ in rooms]
    end, part = 0, 0
    for i, c in enumerate(costs):
        while part < len(rooms) - 1 and end + c / 2 > bounds[part]:
            part += 1
        while part < len(rooms) - 1 and sum(costs[j] for j in runs[part]) + c > rooms[part]:
            part += 1  # rounding would overflow this part: the layer goes on
        runs[part].append(i)
        end += c
    return runs


def plan_split(target: ModelSize, local_room: int, workers: list[tuple[str, int, int]], n_ctx: int, n_ubatch: int,
               max_tree: int, kv_bytes: int = F32) -> RpcSplit:
    """The split for `workers` [(endpoint, device, free bytes)], this machine offering `local_room`
    for the target's layers; an OndeviceError when all of them together do not hold the target."""
    if not target.layer_bytes:
        raise OndeviceError("this target's layers are not known from its file header; it cannot be split across workers.")
    kv = -(-n_ctx // 256) * 256 * target.n_head_kv * target.head_dim * 2 * kv_bytes
    costs = [b + kv for b in target.layer_bytes]
    reserve = worker_reserve(target, n_ctx, n_ubatch, max_tree)
    rooms = [max(0, local_room)] + [max(0, free - reserve) for _, _, free in workers]
    rooms[-1] = max(0, rooms[-1] - target.head_bytes)  # the last worker holds the LM head
    if sum(rooms) < sum(costs):
        have = ", ".join(f"{name} {format_bytes(r)}" for name, r in zip([LOCAL] + [w[0] for w in workers], rooms))
        raise OndeviceError(
            f"the target's layers and KV cache need {format_bytes(sum(costs))} (+ {format_bytes(target.head_bytes)} LM head on the "
            f"last worker), but the room offered is {have}; add a worker, give them more memory (--mem), or use a shorter --ctx.")
    runs = assign_layers(costs, rooms)
    over = [j for j, run in enumerate(runs) if sum(costs[i] for i in run) > rooms[j]]
    if over:  # the layers come in runs: the rooms add up, but a run does not fit where it must go
        raise OndeviceError(f"the target's layers do not divide into runs that fit the room each part offers; "
                            "give the workers more memory (--mem) or use a shorter --ctx.")
    if any(not run for run in runs[1:]):
        idle = [w[0] for w, run in zip(workers, runs[1:]) if not run]
        raise OndeviceError(f"worker {', '.join(idle)} would hold no layers (too little memory offered); leave it out of --rpc.")
    parts = [Part(LOCAL if j == 0 else workers[j - 1][0], rooms[j], tuple(run), j == len(runs) - 1,
                  sum(target.layer_bytes[i] for i in run) + (target.head_bytes if j == len(runs) - 1 else 0))
             for j, run in enumerate(runs)]  # fmt: skip
    return RpcSplit(tuple(parts), tuple(dev for _, dev, _ in workers), target.n_layers, kv)


def connect_workers(endpoints: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """[(endpoint, device, free bytes)] of each worker's first device, asked over the network."""
    from ondevice.rpc.faults import install_abort_handler

    install_abort_handler(endpoints)  # llama.cpp aborts on a worker lost while it loads, too
    out = []
    for e in endpoints:
        devices = library.worker_devices(e)
        if not devices:
            raise OndeviceError(f"worker {e} offers no device.")
        out.append((e, devices[0], library.device_memory(devices[0])[0]))
    return out


def local_room(budget: int, resident: int) -> int:
    """What this machine offers the target's layers: its budget less everything else resident."""
    return max(0, budget - resident - MARGIN)
