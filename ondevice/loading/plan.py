"""How one pair is loaded: the `LoadPlan` (backends, threads, context, memory plan), made once by
`loading/choices.plan_load`, and what opens the models as it says (`open_target`; the drafter through
draft/loader.py). `load_model_file` opens one GGUF alone, as a pair's would be.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ondevice.catalog.hub import PairFiles
from ondevice.draft.held_weights import held_bytes
from ondevice.draft.loader import load_drafter
from ondevice.draft.requantized import drafter_weights
from ondevice.loading.footprint import ModelSize
from ondevice.loading.memory import MARGIN, MemoryPlan, plan_memory
from ondevice.loading.options import LoadOptions
from ondevice.machine.facts import cuda_available, default_threads
from ondevice.machine.ram import RamBudget, ram_budget, unmap_large_frees
from ondevice.loading.rpc_load import plan_split_load
from ondevice.loading.rpc_split import RpcSplit
from ondevice.plan.auto import CPU_MAX_TREE
from ondevice.decode.protocols import FREE_TREE_NODES, MAX_BUDGET
from ondevice.sizes import parse_size
from ondevice.targets.loader import load_target
from ondevice.targets.page_cache import WINDOW_AHEAD
from ondevice.vocabtrim.build import find_trimmed
from ondevice.catalog.stores.derived import repacked_paths
from ondevice.machine.repack_layouts import layouts_repacked
from ondevice.targets.repacked_copy import ensure_copy


@dataclass(frozen=True)
class LoadPlan:
    """How one pair is loaded, decided once before a model is: the backends, threads, context and
    (llama.cpp target) memory plan."""

    files: PairFiles
    options: LoadOptions  # the device and budgets of a torch target, the drafter's vocab-trim switch
    target_backend: str
    drafter_backend: str
    threads: int
    n_ctx: int
    memory: MemoryPlan | None  # None for the torch and ONNX targets, which plan their own memory
    split: RpcSplit | None = None  # --rpc: which layers live on this machine and on each worker
    lean: LoadPlan | None = None  # a target streaming with the drafter: the plan without it (loading/drafter_room.py)

    @property
    def streams(self) -> bool:
        return self.memory is not None and self.memory.streams

    def unsteered(self) -> LoadPlan:
        """This plan with a streaming target's file left to the page cache (MemoryPlan.unsteered)."""
        return replace(self, memory=self.memory.unsteered()) if self.streams else self

    def open_target(self, backend: str | None = None):
        """The target as planned, or on another `backend` (llama.cpp's defaults, not the plan's)."""
        opts, memory = self.options, self.memory if backend is None else None
        return open_target(backend or self.target_backend, self.files.target, self.n_ctx, self.threads, opts, memory,
                           self.split if backend is None else None)

    def open_drafter(self, backend: str | None = None, target_vocab: int | None = None):
        """The drafter model as planned, or on another `backend` (buffers not sized by the plan)."""
        memory = self.memory if backend is None else None
        return load_drafter(backend or self.drafter_backend, self.files.drafter, self.n_ctx, self.threads, self.options.vocab_trim, target_vocab,
                            memory.llama_drafter_sizes() if memory is not None else None)


class MemoryPlans:
    """The memory plans of one load, within --ram-memory or the RAM this process may use: each GGUF
    header is read once, and each plan made once (one per drafter file and context asked)."""

    def __init__(self, files: PairFiles, opts: LoadOptions, process_bytes: int | None = None, vocab_bytes: int = 0):
        self.files, self.opts, self.process_bytes, self.vocab_bytes = files, opts, process_bytes, vocab_bytes
        self._sizes: dict[tuple[Path, int, int], ModelSize] = {}
        self._plans: dict[tuple, MemoryPlan] = {}
        self.split: RpcSplit | None = None  # --rpc: the split of the last plan made

    def without_drafter(self) -> MemoryPlans:
        """The plans of the same load without the drafter model (the headers already read are kept)."""
        lean = MemoryPlans(replace(self.files, drafter=None), self.opts, self.process_bytes, self.vocab_bytes)
        lean._sizes = self._sizes
        return lean

    def size(self, path: Path) -> ModelSize:
        key = file_identity(path)
        if key not in self._sizes:
            self._sizes[key] = ModelSize.from_gguf(path)
        return self._sizes[key]

    def drafter_file(self, requantized: bool = True) -> Path | None:
        """The GGUF a llama.cpp drafter of these files loads: its trimmed vocabulary where one is
        built (and asked for); with `requantized`, its copy where one is written (draft/requantized.py)."""
        drafter = self.files.drafter
        if drafter is None:
            return None
        weights = (find_trimmed(drafter) if self.opts.vocab_trim else None) or drafter
        return drafter_weights(weights) if requantized else weights

    def plan(self, backend: str, drafter_backend: str = "llama", n_ctx: int | None = None) -> MemoryPlan | None:
        """Where a llama.cpp target lives (RAM or streamed from disk) and how its buffers (and the
        drafter's: the trimmed one where it drafts) are sized; None for the torch and ONNX targets."""
        if backend != "llama":
            return None
        drafter = self.drafter_file() if drafter_backend == "llama" else self.files.drafter  # an ONNX drafter is counted as its GGUF
        key = (file_identity(drafter) if drafter is not None else None, n_ctx or self.opts.context)
        if key not in self._plans:
            sizes = self.size(drafter) if drafter is not None else None
            if self.opts.rpc is not None:  # the target's layers across this machine and the workers
                self._plans[key], self.split = plan_split_load(self.size(self.files.target), sizes, replace(self.opts, ctx=key[1]), self.process_bytes)
            else:
                held = held_bytes(drafter, sizes.file_bytes, sizes.embd_bytes) if sizes is not None and drafter_backend == "llama" else None
                self._plans[key] = plan_for(self.size(self.files.target), sizes, replace(self.opts, ctx=key[1]), self.process_bytes, held,
                                            self.vocab_bytes)
        return self._plans[key]


def file_identity(path: Path) -> tuple[Path, int, int]:
    """A file as the plans know it: a drafter trimmed or requantized again during the load (a newer
    keep set shipped) keeps its name, and its size must then be read again."""
    stat = Path(path).stat()
    return Path(path), stat.st_size, stat.st_mtime_ns


def plan_for(target: ModelSize, drafter: ModelSize | None, opts: LoadOptions, process_bytes: int | None = None,
             drafter_bytes: int | None = None, vocab_bytes: int = 0) -> MemoryPlan:
    """The memory plan for a llama.cpp target and drafter of these sizes, within --ram-memory or the
    RAM this process may use (also for models that exist only as sizes: synthetic, not downloaded).
    drafter_bytes: what the drafter holds in RAM, where less than its file (draft/held_weights.py).
    vocab_bytes: the tokenizer's vocabulary, in process_bytes, let go of where the target streams."""
    budget = load_budget(opts)
    tree_nodes = (opts.free_tree_nodes or FREE_TREE_NODES) if drafter is None else None  # no drafter model: free trees only
    return plan_memory(target, drafter, n_ctx=opts.context, budget=budget, ahead=WINDOW_AHEAD, process_bytes=process_bytes,
                       tree_nodes=tree_nodes, drafter_bytes=drafter_bytes, vocab_bytes=vocab_bytes)


def load_budget(opts: LoadOptions) -> RamBudget:
    """The RAM a load may use: what this process may (`ram_budget`), or --ram-memory where less."""
    budget = ram_budget()
    if opts.ram_memory is not None and parse_size(opts.ram_memory) < budget.bytes:  # --ram-memory: the user's budget
        budget = RamBudget(parse_size(opts.ram_memory), "--ram-memory")
    return budget


def streams_surely(target: Path, opts: LoadOptions, process_bytes: int) -> bool:
    """Whether a llama.cpp target's file cannot be held in RAM beside this process, whatever else the
    load holds: its memory plan will stream it (loading/memory.py's rule, without the drafter and
    buffers; the file's size, not its header: the plan reads that once)."""
    if pick_backend(opts.target_backend) != "llama":
        return False
    return process_bytes + Path(target).stat().st_size + MARGIN > load_budget(opts).bytes


def pick_backend(name: str) -> str:
    if name != "auto":
        return name
    return "torch" if cuda_available() else "llama"  # on a CPU-only machine llama.cpp is the fast target


def largest_tree(on_gpu: bool) -> int:
    """The largest target pass to profile and place for: as many nodes as any draft may hold on a
    GPU; fewer on a CPU, where the pass cost grows steeply with the tree."""
    return MAX_BUDGET if on_gpu else CPU_MAX_TREE


def open_target(backend: str, path: Path, n_ctx: int, threads: int, opts: LoadOptions, memory: MemoryPlan | None,
                split: RpcSplit | None = None):
    """The target on `backend`: the ONNX one (onnx/target.py), else as targets/loader.py opens it,
    sized by `memory` (None: llama.cpp's defaults)."""
    if backend == "onnx":
        from ondevice.onnx.target import (
            OnnxTarget,  # lazy: imports torch and ONNX Runtime (~1.4 s)
        )

        return OnnxTarget.from_gguf(path, n_ctx=n_ctx, threads=threads)
    sized = memory.llama_target_sizes() if memory is not None else None
    if split is not None:  # its layers split across the workers
        sized = {**(sized or {}), "split": split}
    if memory is not None and memory.streams:
        unmap_large_frees()  # the heap shares the limit with the kept layers: what it frees goes back
    if backend == "llama" and sized and sized.get("streams") and split is None and opts.repacked_stream and layouts_repacked():
        sized = {**sized, "repacked": ensure_copy(path, *repacked_paths(path), say=_say)}
    return load_target(backend, path, n_ctx, threads, sized, opts.device, opts.gpu_memory, opts.ram_memory, largest_tree(on_gpu=False))


def backend_label(backend: str, threads: int) -> str:
    """How a target runs, as profiles are keyed: e.g. "llama-cpu-t2", "torch-cuda-t8"."""
    on_gpu = backend == "torch" and cuda_available()
    return f"{backend}-{'cuda' if on_gpu else 'cpu'}-t{threads}"


def load_model_file(path, role: str, opts: LoadOptions, memory: MemoryPlan | None = None):
    """(backend label, model) for one GGUF alone, no pair: the target (chosen and placed as a pair's
    would be; a llama.cpp one as `memory` plans, see `plan_for`) or the drafter (`role` "drafter":
    --drafter-backend, llama.cpp for auto; full vocabulary)."""
    opts.checked()
    threads = opts.threads or default_threads()
    if role == "drafter":
        backend = "llama" if opts.drafter_backend == "auto" else opts.drafter_backend
        return backend_label(backend, threads), load_drafter(backend, path, opts.context, threads, vocab_trim=False)
    backend = pick_backend(opts.target_backend)
    return backend_label(backend, threads), open_target(backend, path, opts.context, threads, opts, memory)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
