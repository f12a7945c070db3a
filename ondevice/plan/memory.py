"""The memory plan: where the target lives, decided at load from sizes alone.

    plan = plan_memory(ModelSize.from_gguf(target), ModelSize.from_gguf(drafter), n_ctx=4096)
    plan.describe()   # 'target 1.1 GB streams from disk (1.1 GB read per pass); RAM 1.4 GB (cgroup
                      #  limit 1.5 GB) holds the drafter 491 MB, buffers 310 MB, process 60 MB'

Memory model, in bytes, for a llama.cpp target on a CPU:

    resident = process (interpreter and libraries: this process's RSS before loading)
             + drafter weights (read into anonymous memory, so the page cache cannot evict them)
             + each llama.cpp context's buffers: KV cache, output logits, compute (`ContextBuffers`),
               sized for the largest tree the plan allows (`max_tree` nodes)
    the target is in RAM   if resident + target file + margin <= budget: after the first pass its
                           pages stay in the page cache (mapped; llama.cpp may repack them);
    else it streams         the file stays mapped and unrepacked, and every pass re-reads from disk
                           what the page cache could not keep: about the whole file, since a scan
                           larger than the cache evicts each page before its next use.

When the target streams, big trees cost little time (a pass is bound by the disk) but their logits
cost memory (n_vocab × 4 bytes per node, twice): `max_tree` is the largest of TREE_SIZES whose
buffers still leave the streaming window free. On a GPU (torch target) the layers' tiers come from
`ondevice.offload.placement.plan_placement` (`plan_gpu`), the same plan the loader uses.

The budget (`ram.ram_budget`) honours a cgroup memory limit as well as available RAM. Issue 11's
`ondevice models` and issue 14's predictions call `plan_memory` with shapes from the catalog or the
file header, without loading anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ondevice.gguf_header import read_header
from ondevice.plan.ram import RamBudget, ram_budget
from ondevice.sizes import format_bytes

F32, F16 = 4, 2
MARGIN = 64 << 20  # RAM left for the kernel's own bookkeeping and allocator slack
TREE_SIZES = (64, 32, 16, 8)  # max_tree of a streaming target, largest first: on a CPU a pass over more
# nodes costs more compute than the disk read it shares, and every node's logits (n_vocab × 4 bytes,
# twice) come out of the page cache that holds the target
IN_RAM_MAX_TREE = 512  # a CPU target in RAM: --budget up to 511 (its profile, and so the planner, stop at 256)
DRAFT_BATCH = 64  # nodes a drafter decodes in one call (LlamaDrafter's max_batch)


@dataclass(frozen=True)
class ModelSize:
    """What a model's memory depends on: its file, and the shapes that size its KV cache and logits.
    From a GGUF header (`from_gguf`, any architecture llama.cpp runs) or an architecture preset
    (`from_shape`, for a model not downloaded: ondevice.synthetic.shapes)."""

    file_bytes: int  # the weights as stored (all parts of a split model)
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    layer_bytes: tuple[int, ...] = ()  # each decoder block's bytes in the file (empty: unknown)

    @classmethod
    def from_gguf(cls, path: str | Path) -> "ModelSize":
        header = read_header(path)
        n_head = int(header.arch_value("attention.head_count", 1))
        n_embd = int(header.arch_value("embedding_length", 0))
        layers = header.layer_ranges()
        return cls(
            file_bytes=sum({t.path: t.path.stat().st_size for t in header.tensors.values()}.values()),
            n_layers=int(header.arch_value("block_count", len(layers))), n_embd=n_embd, n_head=n_head,
            n_head_kv=int(header.arch_value("attention.head_count_kv", n_head)),
            head_dim=int(header.arch_value("attention.key_length", n_embd // max(n_head, 1))),
            n_vocab=header.n_vocab, layer_bytes=tuple(sum(t.nbytes for t in layers[i]) for i in sorted(layers)),
        )

    @classmethod
    def from_shape(cls, shape, file_bytes: int) -> "ModelSize":
        """From an `ondevice.synthetic.shapes.ModelSize` and the file size its quant mix gives."""
        return cls(file_bytes, shape.n_layers, shape.dim, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.vocab)

    @property
    def streamed_window(self) -> int:
        """Page cache a streamed pass needs at the least: two decoder layers in flight."""
        per_layer = max(self.layer_bytes) if self.layer_bytes else self.file_bytes // max(self.n_layers, 1)
        return 2 * per_layer


@dataclass(frozen=True)
class ContextBuffers:
    """What one llama.cpp context allocates besides the weights (all of it touched, so resident)."""

    kv: int  # KV cache: cells × layers × kv heads × head dim × (K + V) × bytes per value
    output: int  # logits rows kept for the caller: max(sequences, outputs) × n_vocab × 4
    compute: int  # the graph's scratch, reused across the graph: the larger of one ubatch's
    #               logits and its attention scores (heads × cells per token)

    @property
    def total(self) -> int:
        return self.kv + self.output + self.compute


def context_buffers(
    shape: ModelSize, cells: int, n_ubatch: int, n_outputs: int, n_seq: int = 1, kv_bytes: int = F32
) -> ContextBuffers:
    """llama.cpp's buffers for a context of `cells` KV cells that returns at most `n_outputs` logits
    rows per call (against the sizes llama.cpp reports: tests/test_memory_plan.py)."""
    kv = cells * shape.n_layers * shape.n_head_kv * shape.head_dim * 2 * kv_bytes
    output = max(n_seq, n_outputs) * shape.n_vocab * F32
    logits = min(n_ubatch, n_outputs) * shape.n_vocab * F32 + n_ubatch * 3 * shape.n_embd * F32
    attention = n_ubatch * (shape.n_head * cells + 7 * shape.n_embd) * F32
    return ContextBuffers(kv, output, max(logits, attention))


@dataclass(frozen=True)
class ContextSizes:
    """How to size the target's and the drafter's llama.cpp contexts for a plan."""

    max_tree: int  # most nodes the target verifies in one pass (its outputs per call)
    target_seqs: int  # sequences of the target's context (one per tree leaf, plus the main one)
    target_ubatch: int  # prompt tokens per target pass (each pass reads every weight once)
    drafter_cells: int  # KV cells of the drafter: context + the biggest tree it grows + one batch
    drafter_seqs: int
    drafter_ubatch: int


def context_sizes(n_ctx: int, max_tree: int, streams: bool, draft_batch: int = DRAFT_BATCH) -> ContextSizes:
    """A streaming target prefills 256 tokens per pass (its attention scratch is then half of 512's)
    and its resident drafter 64 (it is never asked for more at once while drafting)."""
    seqs = min(256, max_tree + 1)
    target_ubatch, drafter_ubatch = (256, draft_batch) if streams else (512, 512)
    return ContextSizes(max_tree, min(256, max_tree), target_ubatch, n_ctx + max_tree + draft_batch, seqs, drafter_ubatch)


@dataclass(frozen=True)
class MemoryPlan:
    budget: RamBudget
    target: ModelSize
    drafter_bytes: int  # drafter weights kept resident (0: no drafter)
    process_bytes: int
    buffers: dict[str, int]  # what each context allocates, by name
    sizes: ContextSizes
    target_in_ram: bool
    notes: list[str] = field(default_factory=list)

    @property
    def resident_bytes(self) -> int:
        """Everything but the target's weights: it stays in RAM whatever the page cache does."""
        return self.process_bytes + self.drafter_bytes + sum(self.buffers.values())

    @property
    def cache_room(self) -> int:
        """What is left of the budget for the target's pages in the page cache."""
        return max(0, self.budget.bytes - self.resident_bytes - MARGIN)

    @property
    def streams(self) -> bool:
        return not self.target_in_ram

    @property
    def drafter_kv(self) -> str:
        """The drafter's KV cache type: f16 (half the bytes) when the target streams; its values
        change only what is drafted, never what the target emits."""
        return "f32" if self.target_in_ram else "f16"

    @property
    def placement(self) -> str:
        return "ram" if self.target_in_ram else "disk"

    @property
    def bytes_read_per_pass(self) -> int:
        """Predicted disk reads per target pass: none in RAM, about the whole file when streaming."""
        return 0 if self.target_in_ram else self.target.file_bytes

    def describe(self) -> str:
        where = (
            "target in RAM" if self.target_in_ram
            else f"target streams from disk ({format_bytes(self.bytes_read_per_pass)} read per pass)"
        )
        text = (
            f"{where}: {format_bytes(self.target.file_bytes)} target, RAM {self.budget.describe()} holds "
            f"drafter {format_bytes(self.drafter_bytes)}, buffers {format_bytes(sum(self.buffers.values()))} "
            f"(trees up to {self.sizes.max_tree} nodes), process {format_bytes(self.process_bytes)}"
        )
        return "; ".join([text, *self.notes])

    def to_dict(self) -> dict:
        return {
            "placement": self.placement, "target_bytes": self.target.file_bytes, "drafter_bytes": self.drafter_bytes,
            "process_bytes": self.process_bytes, "buffers": dict(self.buffers), "ram_budget": self.budget.bytes,
            "ram_source": self.budget.source, "max_tree": self.sizes.max_tree,
            "predicted_bytes_read_per_pass": self.bytes_read_per_pass, "summary": self.describe(),
        }


def _buffers(target: ModelSize, drafter: ModelSize | None, n_ctx: int, sizes: ContextSizes, drafter_kv: int) -> dict[str, int]:
    t = context_buffers(target, n_ctx, sizes.target_ubatch, sizes.max_tree, sizes.target_seqs)
    out = {"target KV cache": t.kv, "target logits + compute": t.output + t.compute}
    if drafter is not None:
        d = context_buffers(drafter, sizes.drafter_cells, sizes.drafter_ubatch, DRAFT_BATCH, sizes.drafter_seqs, drafter_kv)
        out |= {"drafter KV cache": d.kv, "drafter logits + compute": d.output + d.compute}
    return out


def plan_memory(
    target: ModelSize,
    drafter: ModelSize | None = None,
    *,
    n_ctx: int = 4096,
    max_tree: int = IN_RAM_MAX_TREE,
    budget: RamBudget | None = None,
    process_bytes: int | None = None,
) -> MemoryPlan:
    """Where the target lives and how big the buffers may be; nothing is loaded.

    max_tree: the largest tree wanted when the target fits in RAM (a streaming target gets the largest
    of TREE_SIZES up to it whose buffers leave room to stream). budget: RAM this process may use
    (default: `ram_budget()`, cgroup-aware). process_bytes: default this process's RSS now.
    """
    budget = budget or ram_budget()
    process = psutil.Process().memory_info().rss if process_bytes is None else process_bytes
    drafter_bytes = drafter.file_bytes if drafter is not None else 0

    def plan(tree: int, in_ram: bool, notes=()) -> MemoryPlan:
        sizes = context_sizes(n_ctx, tree, streams=not in_ram)
        buffers = _buffers(target, drafter, n_ctx, sizes, drafter_kv=F32 if in_ram else F16)
        return MemoryPlan(budget, target, drafter_bytes, process, buffers, sizes, in_ram, list(notes))

    full = plan(max_tree, True)
    if full.resident_bytes + target.file_bytes + MARGIN <= budget.bytes:
        return full
    for tree in (t for t in TREE_SIZES if t <= max_tree):
        streaming = plan(tree, False)
        if streaming.cache_room >= target.streamed_window:
            return streaming
    short = plan(min(TREE_SIZES), False)
    need = short.resident_bytes + target.streamed_window + MARGIN
    return plan(min(TREE_SIZES), False, [
        f"over budget: streaming needs about {format_bytes(need)}; expect heavy paging "
        "(free memory, use a shorter --ctx, or --no-draft)"
    ])
