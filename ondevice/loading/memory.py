"""The memory plan: where the target lives, decided at load from sizes alone.

    plan = plan_memory(ModelSize.from_gguf(target), ModelSize.from_gguf(trimmed_drafter), n_ctx=256, ahead=2)
    plan.describe()   # 'target streams from disk (541 MB read per pass), its LM head and 9 of 28
                      #  layers kept in RAM: 1.1 GB target, RAM 1.2 GB (cgroup limit 1.2 GB) holds drafter
                      #  300 MB, buffers 114 MB (context 256 tokens, trees up to 32 nodes), process 105 MB'

Memory model, in bytes, for a llama.cpp target on a CPU:

    resident = process (interpreter and libraries: this process's anonymous memory before loading)
             + drafter weights (when the target streams: held where the page cache cannot evict
               them, without an input table they do not read, draft/held_weights.py)
             + each llama.cpp context's buffers: KV cache, output logits, compute (`ContextBuffers`, loading/footprint.py),
               sized for the largest tree the plan allows (`max_tree` nodes) and the context
               (`n_ctx` cells; in f16 when the target streams, `kv_type`; `answer_context` when
               the prompts and answer length are known)
    the target is in RAM   if resident + what a pass reads + margin <= budget (the file but for a
                           separate input embedding table, read a row per token): after the first
                           pass its pages stay in the page cache (mapped; llama.cpp may repack them);
    else it streams         the file stays mapped and unrepacked; with the page cache steered layer
                           by layer (targets/page_cache.py, `ahead` layers in flight) as many layers
                           as fit in the room left, less what decoding may add (`decode_slack`), spread
                           evenly through the pass, stay cached (`kept_layers`), and every pass reads
                           the others and the LM head from disk (`bytes_read_per_pass`).

When the target streams, trees up to TREE_SIZES cost little time (the disk bounds the pass) but their
logits cost memory (n_vocab × 4 bytes per node in llama.cpp's output and scratch, and decoding's
copy): `max_tree` is the largest of TREE_SIZES whose buffers leave the streaming window free and
the LM head kept, where any size keeps it (a streamed head needs all its size at the end of every
pass, and sends every layer through the page cache, targets/page_cache.py, not the direct reads of
targets/direct_window.py). The plan also says when the drafter alone keeps the target out of RAM
(loading/drafter_room.py weighs it against the layers its RAM would keep). On a GPU (torch target): `ondevice.targets.offloaded.plan_offload`.

The budget (`ram.ram_budget`) is what this process may use in all, within a cgroup memory limit and available RAM.
`ondevice models` calls `plan_memory` with sizes from the file header or a shape preset, loading nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import psutil

from ondevice.draft.recycle import table_bytes as recycled_table_bytes
from ondevice.files.gguf_header import OUTPUT_LAYER
from ondevice.loading.footprint import CELL_PAD, F16, F32, ModelSize, context_buffers
from ondevice.machine.ram import RamBudget, anon_rss, ram_budget
from ondevice.sizes import format_bytes
from ondevice.spread import spread_layers

TEMPLATE_SLACK = 16  # tokens a chat template's switches (a thinking block) may add to a prompt counted without them
MARGIN = 64 << 20  # RAM left for the kernel's own bookkeeping and allocator slack
DECODE_COPIES = 1  # logits rows of the largest tree the kept layers leave room for, beyond llama.cpp's own (see decode_slack)
TREE_SIZES = (32, 16, 8)  # max_tree of a streaming target, largest first: on a CPU a pass over more nodes
# costs more compute than the disk read it shares, and every node's logits (n_vocab × 4 bytes, three times)
# come out of the page cache that holds the target (docs/measurements/2026-12-07-vocabulary-once.md)
IN_RAM_MAX_TREE = 512  # a CPU target in RAM: --budget up to 511 (its profile, and so the planner, stop at 256)
DRAFT_BATCH = 64  # nodes a drafter decodes in one call (LlamaDrafter's max_batch)


def answer_context(longest_prompt: int, max_tokens: int, max_tree: int) -> int:
    """The context (KV cells, in llama.cpp's steps of 256) that answering a prompt of
    `longest_prompt` tokens with up to `max_tokens` needs, with room for one more tree of
    `max_tree` nodes and a few template tokens: for a streaming target, every cell not allocated is
    RAM that keeps one more of its layers cached (fewer bytes read per pass)."""
    need = longest_prompt + max_tokens + max_tree + 1 + TEMPLATE_SLACK
    return -(-need // CELL_PAD) * CELL_PAD


@dataclass(frozen=True)
class ContextSizes:
    """How to size the target's and the drafter's llama.cpp contexts for a plan."""

    max_tree: int  # most nodes the target verifies in one pass (its outputs per call)
    target_seqs: int  # sequences of the target's context (one per tree leaf, plus the main one)
    target_ubatch: int  # prompt tokens per target pass (each pass reads every weight once)
    drafter_cells: int  # KV cells of the drafter: context + the biggest tree it grows + one batch
    drafter_seqs: int
    drafter_ubatch: int
    n_ctx: int  # the target's context window in tokens (its KV cells)
    drafter_batch: int = DRAFT_BATCH  # nodes the drafter decodes in one call at most (its logits rows: LlamaDrafter's max_batch)


def context_sizes(n_ctx: int, max_tree: int, streams: bool, draft_batch: int = DRAFT_BATCH) -> ContextSizes:
    """A streaming target prefills 256 tokens per pass (its attention scratch is then half of 512's)
    and its resident drafter `draft_batch` or the largest tree if smaller (a tree's frontier never
    holds more nodes than the tree: each row more is logits memory the target's layers never get)."""
    seqs = min(256, max_tree + 1)
    draft_batch = min(draft_batch, max_tree) if streams else draft_batch
    target_ubatch, drafter_ubatch = (256, draft_batch) if streams else (512, 512)
    return ContextSizes(max_tree, min(256, max_tree), target_ubatch, n_ctx + max_tree + draft_batch, seqs, drafter_ubatch, n_ctx, draft_batch)


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
    ahead: int = 0  # a streaming target's page cache is steered with this many layers in flight (0: not)
    steered: bool = True  # False: the file mapped and left to the kernel's page cache (`unsteered`)

    @property
    def resident_bytes(self) -> int:
        """Everything but the target's weights: it stays in RAM whatever the page cache does."""
        return self.process_bytes + self.drafter_bytes + sum(self.buffers.values())

    @property
    def cache_room(self) -> int:
        """What is left of the budget for the target's pages in the page cache."""
        return max(0, self.budget.bytes - self.resident_bytes - MARGIN)

    @property
    def over_budget(self) -> bool:
        """Streaming with less room than a pass needs in flight: its pages are evicted before they are used."""
        return self.streams and self.cache_room < self.target.streamed_window

    @property
    def decode_slack(self) -> int:
        """Room the kept layers leave for what decoding adds past the plan: the recycled candidates'
        table (draft/recycle.py, made at the first verified tree) and DECODE_COPIES copies of the
        largest tree's logits rows for decoding's own arrays (the drafter's log-probs, verification's
        rows, the heap they leave; the target's logits are llama.cpp's buffer, lent, not copied):
        without it that memory is taken from the kept layers, which then fault back a page at a time
        during compute (docs/measurements/code-notes.md, "Decode slack")."""
        if not self.streams:
            return 0
        return recycled_table_bytes(self.target.n_vocab) + DECODE_COPIES * self.sizes.max_tree * self.target.n_vocab * F32

    @property
    def streams(self) -> bool:
        return not self.target_in_ram

    @property
    def kv_type(self) -> str:
        """Both contexts' KV cache type: f32 in RAM; f16 (half the bytes: RAM the target's layers
        can use) when the target streams. The drafter's changes only what is drafted; the target's
        is llama.cpp's default type, and its target alone runs with it too, so the output stays
        the target's own (within the near-tie rule, as any batch size)."""
        return "f32" if self.target_in_ram else "f16"

    @property
    def placement(self) -> str:
        return "ram" if self.target_in_ram else "disk"

    def unsteered(self) -> "MemoryPlan":
        """The same plan with the file mapped and the page cache left to the kernel, as llama.cpp
        itself leaves it: no window, no layers kept by hand. Where the target nearly fits, the kernel
        keeps about the room's layers cached without the window's own room and reads; where it does
        not, it evicts each page before it is read again (loading/drafter_room.py times both)."""
        return replace(self, steered=False)

    def llama_target_sizes(self) -> dict:
        """The llama.cpp target's keyword arguments this plan sets (targets/loader.py opens it)."""
        window = self.ahead if self.steered else 0
        return {"max_tree_nodes": self.sizes.max_tree, "n_ubatch": self.sizes.target_ubatch, "streams": self.streams,
                "window": window, "kv_type": self.kv_type, "kept_layers": self.kept_layers(window) if window else (),
                "lend_logits": self.streams}

    def llama_drafter_sizes(self) -> dict:
        """The llama.cpp drafter's keyword arguments this plan sets: buffers sized, weights held where
        the page cache cannot evict them when the target streams (draft/held_weights.py; draft/loader.py opens it)."""
        return {"max_tree": self.sizes.max_tree, "resident": self.streams, "kv_type": self.kv_type, "n_batch": self.sizes.drafter_ubatch,
                "max_batch": self.sizes.drafter_batch}

    def kept_layers(self, ahead: int) -> tuple[int | str, ...]:
        """What a streaming target keeps cached between passes when the page cache is steered
        (targets/page_cache.py) with `ahead` layers in flight, in what the room left holds after the
        window: the LM head first (OUTPUT_LAYER; streamed, all of it would be in flight at once at the
        end of every pass), then decoder layers spread evenly through the pass (`spread_layers`).
        Empty when the target is in RAM."""
        sizes = self.target.layer_bytes
        if self.target_in_ram or not sizes:
            return ()
        window = (ahead + 1) * max(sizes)
        room = self.cache_room - window - self.decode_slack
        head = self.target.head_bytes
        keep_head = 0 < head <= room
        room -= head if keep_head else max(0, head + max(sizes) - window)  # a streamed head needs room for all of it
        return ((OUTPUT_LAYER,) if keep_head else ()) + spread_layers(sizes, room)

    @property
    def head_in_ram(self) -> bool:
        """The LM head stays in RAM between passes (a streamed one sends every layer through the page cache)."""
        return self.target_in_ram or OUTPUT_LAYER in (self.kept_layers(self.ahead) if self.ahead else ())

    @property
    def kept_layer_count(self) -> int:
        """Decoder layers this plan keeps cached (its LM head not counted); 0 unsteered or in RAM."""
        kept = self.kept_layers(self.ahead) if self.ahead else ()
        return len([k for k in kept if k != OUTPUT_LAYER])

    @property
    def bytes_read_per_pass(self) -> int:
        """Predicted disk reads per target pass: none in RAM; when streaming, every decoder layer not
        kept cached and the LM head unless kept (the input embeddings are read a row per token), or
        the whole file when its layers are not known."""
        sizes = self.target.layer_bytes
        if self.target_in_ram:
            return 0
        if not sizes:
            return self.target.file_bytes
        kept = self.kept_layers(self.ahead) if self.ahead else ()
        head = 0 if OUTPUT_LAYER in kept else self.target.head_bytes
        return sum(b for i, b in enumerate(sizes) if i not in kept) + head

    def describe(self, repacked: bool = False) -> str:
        """The plan in a line; repacked: the target streams from its copy in llama.cpp's repacked layouts."""
        copy = " its repacked copy" if repacked else ""
        if self.target_in_ram:
            where = "target in RAM"
        elif self.steered:
            where = (f"target streams{copy} from disk ({format_bytes(self.bytes_read_per_pass)} read per pass)" if self.bytes_read_per_pass
                     else "target read from disk once (nothing read per pass)")  # every layer kept, as `ondevice models` says
        else:  # what the kernel keeps cached is its own: the room is the steered plan's
            where = f"target streams{copy} from disk, the file mapped and left to the page cache (room for"
        kept, layers = (self.kept_layers(self.ahead) if self.ahead else ()), self.kept_layer_count
        if kept:
            counted = f"{layers} of {self.target.n_layers} layers" if layers else ""
            head = "LM head" + (" and " if counted else "") if OUTPUT_LAYER in kept else ""
            where += f", its {head}{counted} kept in RAM" if self.steered else f" about its {head}{counted})"
        elif self.streams and not self.steered:
            where += " none of its layers)"
        text = (f"{where}: {format_bytes(self.target.file_bytes)} target, RAM {self.budget.describe()} holds "
                f"drafter {format_bytes(self.drafter_bytes)}, buffers {format_bytes(sum(self.buffers.values()))} "
                f"(context {self.sizes.n_ctx} tokens, trees up to {self.sizes.max_tree} nodes), process {format_bytes(self.process_bytes)}")
        return "; ".join([text, *self.notes])

    def to_dict(self) -> dict:
        kept = self.kept_layers(self.ahead) if self.ahead else ()
        return {
            "placement": self.placement, "target_bytes": self.target.file_bytes, "drafter_bytes": self.drafter_bytes,
            "process_bytes": self.process_bytes, "buffers": dict(self.buffers), "ram_budget": self.budget.bytes,
            "ram_source": self.budget.source, "max_tree": self.sizes.max_tree, "n_ctx": self.sizes.n_ctx, "kv_type": self.kv_type,
            "predicted_bytes_read_per_pass": self.bytes_read_per_pass, "kept_layers": self.kept_layer_count,
            "head_kept": OUTPUT_LAYER in kept, "page_cache": "steered" if self.steered else "kernel",
            "summary": self.describe(),
        }


def _buffers(target: ModelSize, drafter: ModelSize | None, n_ctx: int, sizes: ContextSizes, kv_bytes: int) -> dict[str, int]:
    t = context_buffers(target, n_ctx, sizes.target_ubatch, sizes.max_tree, sizes.target_seqs, kv_bytes)
    out = {"target KV cache": t.kv, "target logits + compute": t.output + t.compute}
    if drafter is not None:
        d = context_buffers(drafter, sizes.drafter_cells, sizes.drafter_ubatch, sizes.drafter_batch, sizes.drafter_seqs, kv_bytes)
        out |= {"drafter KV cache": d.kv, "drafter logits + compute": d.output + d.compute}
    return out


def streaming_tree_sizes(max_tree: int, tree_nodes: int | None) -> list[int]:
    """The max_tree values a streaming plan tries, largest first: TREE_SIZES up to `max_tree`, and
    with `tree_nodes` known, none above the smallest that holds such a tree (its logits rows in
    llama.cpp's buffers and decoding's copy, ~1.8 MB a node here, would be RAM the target's layers never get)."""
    sizes = [t for t in TREE_SIZES if t <= max_tree]
    holding = [t for t in sizes if t >= tree_nodes] if tree_nodes is not None else []
    return [t for t in sizes if t <= min(holding)] if holding else sizes


def plan_memory(
    target: ModelSize,
    drafter: ModelSize | None = None,
    *,
    n_ctx: int = 4096,
    max_tree: int = IN_RAM_MAX_TREE,
    budget: RamBudget | None = None,
    process_bytes: int | None = None,
    ahead: int = 0,
    tree_nodes: int | None = None,
    drafter_bytes: int | None = None,
    vocab_bytes: int = 0,
) -> MemoryPlan:
    """Where the target lives and how big the buffers may be; nothing is loaded.

    max_tree: the largest tree wanted when the target fits in RAM (a streaming target gets the largest of
    TREE_SIZES up to it whose buffers leave room to stream). budget: RAM this process may use (default:
    `ram_budget()`, cgroup-aware). process_bytes: default this process's RSS now.
    ahead: a streaming target's page cache will be steered with this many layers in flight, so the
    room left keeps its first layers cached (`kept_layers`); 0: the kernel streams it alone.
    tree_nodes: the largest tree this load will verify, where the caller knows it (a load without the
    drafter model: its free drafters' trees, a few nodes): a streaming target's buffers are then sized
    for the smallest of TREE_SIZES that holds it, and the rest of the RAM keeps more of its layers.
    drafter_bytes: what the drafter's weights hold in RAM where less than its file (draft/held_weights.py).
    vocab_bytes: the tokenizer's vocabulary in process_bytes, let go of where the target streams (`Tokenizer.let_go`).
    """
    budget = budget or ram_budget()
    process = (anon_rss() or psutil.Process().memory_info().rss) if process_bytes is None else process_bytes
    drafter_bytes = 0 if drafter is None else drafter.file_bytes if drafter_bytes is None else drafter_bytes

    def plan(tree: int, in_ram: bool, notes=()) -> MemoryPlan:
        sizes = context_sizes(n_ctx, tree, streams=not in_ram)
        buffers = _buffers(target, drafter, n_ctx, sizes, kv_bytes=F32 if in_ram else F16)
        held = process if in_ram else max(0, process - vocab_bytes)
        return MemoryPlan(budget, target, drafter_bytes, held, buffers, sizes, in_ram, list(notes), 0 if in_ram else ahead)

    full = plan(max_tree, True)
    if full.resident_bytes + target.working_bytes + MARGIN <= budget.bytes:
        return full
    alone = None  # would the target fit without the drafter? (the drafter's memory is what tips it over)
    if drafter is not None:
        alone = plan_memory(target, None, n_ctx=n_ctx, max_tree=max_tree, budget=budget, process_bytes=process, vocab_bytes=vocab_bytes)
    note = ["without the drafter the target would fit in RAM (a load leaves it out where that is faster: --keep-drafter keeps it)"] if alone and alone.target_in_ram else []
    streaming = [p for p in (plan(tree, False, note) for tree in streaming_tree_sizes(max_tree, tree_nodes))
                 if not p.over_budget]  # fmt: skip
    keeping_head = [p for p in streaming if OUTPUT_LAYER in p.kept_layers(ahead)] if ahead else []
    if keeping_head or streaming:
        return (keeping_head or streaming)[0]
    short = plan(min(TREE_SIZES), False)
    need = short.resident_bytes + target.streamed_window + MARGIN
    over = f"over budget: streaming needs about {format_bytes(need)}; expect heavy paging (free memory, use a shorter --ctx, or --no-draft)"
    return plan(min(TREE_SIZES), False, [over] + note)

