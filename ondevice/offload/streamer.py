"""`LayerStreamer`: decoder blocks whose weights live off the device and stream in for each pass.

Each streamed layer is ONE contiguous host buffer (pinned on CUDA; see `layout.py` for what is in
it) or, on the disk tier, a range of the model file. The device holds a ring of `ring_slots`
buffers. Copies are numbered by a sequence `s` that runs on across passes: copy `s` brings layer
`order[s % n]` into slot `s % k`. The ring stays full:

    pre-hook of layer s:   compute waits for copy s; the block's parameters become views of
                           slot s % k (or are decoded from it: GGUF blocks, int8 …)
    post-hook of layer s:  the block forgets its parameters (meta tensors), slot s % k is marked
                           free once compute is done, and copy s + k is issued into it

so while layer s computes, copies s+1 … s+k-1 are in flight or done, and copy s+k starts as soon as
layer s is finished; the last layers of a pass prefetch the first ones of the next pass. On CUDA
copies run on a side stream ordered by events; on a CPU "device" on a worker thread (copy_engine).

A forward that skips layers or dies mid-pass (an exception) is noticed at the next pre-hook: the
streamer drains what is in flight and restarts the ring at the layer asked for ("resync").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from ondevice.offload.copy_engine import copy_engine_for
from ondevice.offload.disk import DiskReader
from ondevice.offload.layout import LayerLayout, free_params, point_params, unpack
from ondevice.sizes import format_bytes


@dataclass
class StreamedLayer:
    index: int  # the block's index in the stack
    layout: LayerLayout
    host: torch.Tensor | None  # (layout.nbytes,) uint8, pinned on CUDA; None: read from disk each pass


@dataclass
class TraceEvent:
    kind: str  # "issue" (copy queued), "consume" (layer starts computing), "release" (layer done)
    seq: int
    layer: int
    slot: int


@dataclass
class StreamStats:
    passes: int = 0
    bytes_moved: int = 0  # host → device, all passes (prefetches for the next pass included)
    bytes_consumed: int = 0  # bytes of the layers that computed
    copy_seconds: float = 0.0  # summed duration of the copies whose timing is collected
    copies_timed: int = 0
    bytes_timed: int = 0
    wait_seconds: dict[int, float] = field(default_factory=dict)  # layer → total compute stall
    resyncs: int = 0
    disk_bytes_read: int = 0
    disk_read_seconds: float = 0.0

    @property
    def bytes_per_pass(self) -> float:
        return self.bytes_consumed / self.passes if self.passes else 0.0

    @property
    def bandwidth(self) -> float:
        """Achieved host → device bytes per second while copying."""
        return self.bytes_timed / self.copy_seconds if self.copy_seconds else 0.0

    @property
    def disk_bandwidth(self) -> float:
        return self.disk_bytes_read / self.disk_read_seconds if self.disk_read_seconds else 0.0

    def summary(self) -> str:
        waited = sum(self.wait_seconds.values()) / max(self.passes, 1)
        text = f"{format_bytes(self.bytes_per_pass)} per pass at {format_bytes(self.bandwidth)}/s"
        text += f"; compute waited {waited * 1e3:.1f} ms per pass"
        if self.disk_bytes_read:
            text += f"; disk {format_bytes(self.disk_bandwidth)}/s"
        return text


class LayerStreamer:
    def __init__(
        self,
        blocks: Sequence[nn.Module],
        layers: Sequence[StreamedLayer],
        device: torch.device | str,
        ring_slots: int = 2,
        disk: DiskReader | None = None,
        trace: bool = False,
        timeout_s: float = 120.0,
    ):
        if ring_slots < 1 or not layers:
            raise ValueError("a streamer needs at least one ring slot and one streamed layer")
        if any(layer.host is None for layer in layers) and disk is None:
            raise ValueError("layers without a host buffer need a DiskReader")
        self.blocks, self.device, self.disk = list(blocks), torch.device(device), disk
        self.order = sorted(layers, key=lambda layer: layer.index)  # the pass order
        self.position = {layer.index: p for p, layer in enumerate(self.order)}
        self.k = ring_slots
        slot_bytes = max(layer.layout.nbytes for layer in self.order)
        self.slots = [torch.empty(slot_bytes, dtype=torch.uint8, device=self.device) for _ in range(ring_slots)]
        self.engine = copy_engine_for(self.device, timeout_s)
        self.released = [self.engine.mark() for _ in range(ring_slots)]  # slot free once reached
        self.copies: dict[int, object] = {}  # seq → copy ticket, issued and not yet consumed
        self.reads: dict[int, object] = {}  # seq → disk read ticket, submitted and not yet copied
        self.next_seq = 0  # the next copy a layer will consume
        self.issued = 0  # copies < issued have been issued
        self.released_upto = 0  # layers < released_upto have given their slot back
        self.read_upto = 0  # disk reads are submitted for the disk layers among seqs < read_upto
        self.active: int | None = None  # seq of the layer computing now
        self.stats = StreamStats()
        self.timings: list[tuple[int, int, object, object]] = []  # (layer, bytes, copy ticket, wait)
        self.trace: list[TraceEvent] | None = [] if trace else None
        self.hooks = []
        for layer in self.order:
            block = self.blocks[layer.index]
            free_params(block, layer.layout)
            self.hooks.append(block.register_forward_pre_hook(self._make_pre_hook(layer.index)))
            self.hooks.append(block.register_forward_hook(self._make_post_hook(layer.index)))
        self._submit_reads()
        self._top_up()

    # --- hooks ------------------------------------------------------------------------------
    def _make_pre_hook(self, index: int):
        def pre_hook(block, args):
            self._load(index)

        return pre_hook

    def _make_post_hook(self, index: int):
        def post_hook(block, args, output):
            self._release(index)

        return post_hook

    def _load(self, index: int) -> None:
        position = self.position[index]
        if self.active is not None or position != self.next_seq % len(self.order):
            self._resync(position)
        seq = self.next_seq
        layer, slot = self.order[position], seq % self.k
        ticket = self.copies.pop(seq)
        wait = self.engine.wait(ticket)
        point_params(self.blocks[index], unpack(self.slots[slot][: layer.layout.nbytes], layer.layout))
        self.active, self.next_seq = seq, seq + 1
        self.stats.bytes_consumed += layer.layout.nbytes
        if position == 0:
            self.stats.passes += 1
            self._collect_timings(block=False)
        self.timings.append((index, layer.layout.nbytes, ticket, wait))
        self._record("consume", seq, index, slot)

    def _release(self, index: int) -> None:
        seq = self.active
        if seq is None or self.order[seq % len(self.order)].index != index:
            return  # this layer was not loaded by us (e.g. a resync happened inside its forward)
        free_params(self.blocks[index], self.order[seq % len(self.order)].layout)
        self.released[seq % self.k] = self.engine.mark()
        self.active, self.released_upto = None, seq + 1
        self._record("release", seq, index, seq % self.k)
        self._top_up()

    # --- copies and reads ---------------------------------------------------------------------
    def _top_up(self) -> None:
        """Issue copies while a slot is free: copy s may go once layer s - k has released its slot."""
        while self.issued < self.released_upto + self.k:
            self._issue(self.issued)

    def _issue(self, seq: int) -> None:
        layer, slot = self.order[seq % len(self.order)], seq % self.k
        read = None
        if layer.host is None:
            self._submit_reads()  # makes sure this layer's read is among them
            read = self.reads.pop(seq)
            src = self.disk.wait(read)
        else:
            src = layer.host
        ticket = self.engine.copy(self.slots[slot][: layer.layout.nbytes], src, after=self.released[slot])
        if read is not None:
            self.disk.release(read, after=ticket)  # its staging buffer is free once copied
            self._submit_reads()
        self.copies[seq], self.issued = ticket, seq + 1
        self.stats.bytes_moved += layer.layout.nbytes
        self._record("issue", seq, layer.index, slot)

    def _submit_reads(self) -> None:
        """Keep a read in flight for each staging buffer: the next disk layers in stream order."""
        if self.disk is None:
            return
        while len(self.reads) < self.disk.n_buffers:
            seq = self.read_upto
            while self.order[seq % len(self.order)].host is not None:
                seq += 1
            self.reads[seq] = self.disk.submit(self.order[seq % len(self.order)].index)
            self.read_upto = seq + 1

    def _resync(self, position: int) -> None:
        """Drain everything in flight and restart the ring at `position` of the pass order."""
        self.engine.synchronize()
        for seq in sorted(self.reads):
            read = self.reads.pop(seq)
            self.disk.wait(read)
            self.disk.release(read)
        n = len(self.order)
        if self.active is not None:
            stuck = self.order[self.active % n]
            free_params(self.blocks[stuck.index], stuck.layout)
        seq = self.issued + (position - self.issued) % n  # first seq ≥ issued that is this layer
        self.copies.clear()
        self.released = [self.engine.mark() for _ in range(self.k)]
        self.next_seq = self.issued = self.released_upto = self.read_upto = seq
        self.active = None
        self.stats.resyncs += 1
        self._submit_reads()
        self._top_up()

    # --- bookkeeping --------------------------------------------------------------------------
    def _record(self, kind: str, seq: int, layer: int, slot: int) -> None:
        if self.trace is not None:
            self.trace.append(TraceEvent(kind, seq, layer, slot))

    def _collect_timings(self, block: bool) -> None:
        """Fold finished copies' and waits' timings into stats (CUDA timings need the events done)."""
        if block:
            self.engine.synchronize()
        pending = []
        for layer, nbytes, ticket, wait in self.timings:
            if ticket.done() and wait.done():
                self.stats.copy_seconds += ticket.seconds()
                self.stats.copies_timed += 1
                self.stats.bytes_timed += nbytes
                self.stats.wait_seconds[layer] = self.stats.wait_seconds.get(layer, 0.0) + wait.seconds()
            else:
                pending.append((layer, nbytes, ticket, wait))
        self.timings = pending

    def collect_stats(self) -> StreamStats:
        """Up-to-date stats (waits for in-flight copies)."""
        self._collect_timings(block=True)
        if self.disk is not None:
            self.stats.disk_bytes_read = self.disk.stats.bytes_read
            self.stats.disk_read_seconds = self.disk.stats.read_seconds
        return self.stats

    def close(self) -> None:
        """Remove the hooks and stop the helper threads (the blocks stay parameterless)."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        self.engine.synchronize()
        self.engine.close()
        if self.disk is not None:
            self.disk.close()

    def __enter__(self) -> "LayerStreamer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
