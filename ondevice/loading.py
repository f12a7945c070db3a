"""Loading a pair, planned once: `plan_load` chooses the backends (asked, or the fastest this machine
measured), the threads, the context and the memory plan a llama.cpp target is placed and sized by,
and returns them as one `LoadPlan`; `target/loader.py` and `draft/loader.py` open what it chose and
`pipeline.load_pipeline` wires them into a Pipeline. `ondevice profile` measures what
`load_backends` gives it.
"""

from __future__ import annotations

import multiprocessing
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ondevice.catalog.stores import resolve as stores
from ondevice.catalog.choose import choose
from ondevice.catalog.hub import PairFiles
from ondevice.draft.loader import load_drafter
from ondevice.errors import OndeviceError
from ondevice.machine.facts import (
    cuda_available,
    default_threads,
    machine_facts,
    physical_cores,
)
from ondevice.machine.ram import (
    RamBudget,
    anon_rss,
    ram_budget,
    return_freed_memory,
    unmap_large_frees,
)
from ondevice.onnx.export_files import drafter_export_built
from ondevice.paths import home
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.plan.auto import CPU_MAX_TREE
from ondevice.plan.backends import best_backends
from ondevice.plan.curve import pass_sizes
from ondevice.plan.drafter_room import ALONE_CONTEXT, AlonePass
from ondevice.plan.fallback import MAX_LOOKUP_BUDGET
from ondevice.plan.latency import MAX_TOKENS_PER_PASS, measure_target_timing
from ondevice.plan.memory import MemoryPlan, ModelSize, answer_context, plan_memory
from ondevice.plan.profile import ProfileBackends, get_profile, load_profile
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.rpc.load import RPC_MAX_TREE, RpcSplit, check_rpc_options, plan_split_load
from ondevice.protocols import FREE_TREE_NODES, MAX_BUDGET
from ondevice.sizes import parse_size
from ondevice.target.loader import load_target
from ondevice.target.page_cache import WINDOW_AHEAD
from ondevice.vocabtrim.build import find_trimmed
from ondevice.vocabtrim.head import TrimmedHead
from ondevice.vocabtrim.shipped import trim_for_streaming

DEFAULT_CTX = 4096  # tokens of context unless --ctx, or a streaming target answering known prompts (`sized_context`)
STREAMING_CHAT_CTX = 2048  # `ondevice chat`'s context where the target streams (unless --ctx): answers of its default
# 1024 tokens and as much history, older turns dropped past it; 4096's f16 KV cache (117 MB, default pair) held
# 5 target layers out of a 1.2 GB cgroup without the drafter (19 kept, 252 MB read per pass; 22 and 165 MB at 2048)
TARGET_BACKENDS = ("auto", "torch", "llama", "onnx")
DRAFTER_BACKENDS = ("auto", "llama", "onnx")
CPU_BACKENDS = ("llama", "onnx")  # what the profile compares on a CPU (`ondevice profile`), and auto picks among


@dataclass
class LoadOptions:
    model: str | None = None  # a catalog pair's name; None: the catalog default
    target: str | None = None  # a GGUF file or hf:owner/repo[:QUANT | /file.gguf] instead of the pair's target
    drafter: str | None = None  # the same for the drafter; default: the pair's, or one found automatically
    target_backend: str = "auto"
    drafter_backend: str = "auto"
    draft: bool = True
    vocab_trim: bool = True
    threads: int | None = None
    ctx: int | None = None  # context window in tokens; None: DEFAULT_CTX, or when a llama.cpp target streams, sized to the answers (`Answers`)
    device: str | None = None  # torch target: "cpu" / "cuda"; default: cuda if available
    gpu_memory: str | None = None
    ram_memory: str | None = None
    overlap: bool | None = None  # draft while the target verifies; None: when the target is on a GPU
    keep_drafter: bool | None = None  # None: where the target streams, load the drafter only where it pays
    # for the layers its RAM would keep (plan/drafter_room.py); True: always (a --tree that needs it, --drafter)
    streaming_ctx: int | None = None  # the context of a streaming target when neither --ctx nor the answers say
    # (chat: STREAMING_CHAT_CTX; None: DEFAULT_CTX): every KV cell not allocated keeps target layers cached
    free_tree_nodes: int | None = None  # the largest tree of the free drafters asked for (a --tree lookup/suffix/
    # recycle --budget): a load without the drafter model sizes a streaming target's buffers for it; None: FREE_TREE_NODES
    rpc: str | None = None  # "host:port,…": the target's layers split across this machine and these workers (ondevice/rpc)

    def checked(self) -> "LoadOptions":
        """These options, or an OndeviceError naming the bad one: checked before anything is downloaded."""
        if self.target_backend not in TARGET_BACKENDS:
            raise OndeviceError(f"unknown target backend {self.target_backend!r}; choose one of {', '.join(TARGET_BACKENDS)}.")
        if self.drafter_backend not in DRAFTER_BACKENDS:
            raise OndeviceError(f"unknown drafter backend {self.drafter_backend!r}; choose one of {', '.join(DRAFTER_BACKENDS)}.")
        for flag, size in (("--gpu-memory", self.gpu_memory), ("--ram-memory", self.ram_memory)):
            if size is not None and parse_size(size) <= 0:
                raise OndeviceError(f"{flag} must be more than 0 bytes (got {size!r}).")
        if self.threads is not None and self.threads < 1:
            raise OndeviceError(f"--threads must be at least 1 (got {self.threads}).")
        if self.ctx is not None and self.ctx < 16:
            raise OndeviceError(f"--ctx must be at least 16 tokens (got {self.ctx}).")
        for flag, ref in (("--target", self.target), ("--drafter", self.drafter)):
            if ref is not None:
                stores.check(ref, flag)
        if self.drafter is not None and not self.draft:
            raise OndeviceError("--drafter and --no-draft contradict each other; drop one.")
        if self.rpc is not None:
            check_rpc_options(self)
        return self

    @property
    def context(self) -> int:
        """The context window in tokens: --ctx, else DEFAULT_CTX (plan_load may size it)."""
        return self.ctx or DEFAULT_CTX


@dataclass(frozen=True)
class Answers:
    """What a load will answer, when known (generate, bench): a streaming target's context is sized
    to them (`sized_context`), so its KV cache takes what they use."""

    prompts: tuple  # strings or conversations
    max_tokens: int  # at most this many tokens each


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

    @property
    def streams(self) -> bool:
        return self.memory is not None and self.memory.streams

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

    def __init__(self, files: PairFiles, opts: LoadOptions, process_bytes: int | None = None):
        self.files, self.opts, self.process_bytes = files, opts, process_bytes
        self._sizes: dict[Path, ModelSize] = {}
        self._plans: dict[tuple, MemoryPlan] = {}
        self.split: RpcSplit | None = None  # --rpc: the split of the last plan made

    def size(self, path: Path) -> ModelSize:
        if path not in self._sizes:
            self._sizes[path] = ModelSize.from_gguf(path)
        return self._sizes[path]

    def plan(self, backend: str, drafter_backend: str = "llama", n_ctx: int | None = None) -> MemoryPlan | None:
        """Where a llama.cpp target lives (RAM or streamed from disk) and how its buffers (and the
        drafter's: the trimmed one where it drafts) are sized; None for the torch and ONNX targets."""
        if backend != "llama":
            return None
        drafter = self.files.drafter
        if drafter is not None and self.opts.vocab_trim and drafter_backend == "llama":  # an ONNX drafter is counted as its GGUF
            drafter = find_trimmed(drafter) or drafter
        key = (drafter, n_ctx or self.opts.context)
        if key not in self._plans:
            sizes = self.size(drafter) if drafter is not None else None
            if self.opts.rpc is not None:  # the target's layers across this machine and the workers
                self._plans[key], self.split = plan_split_load(self.size(self.files.target), sizes, replace(self.opts, ctx=key[1]), self.process_bytes)
            else:
                self._plans[key] = plan_for(self.size(self.files.target), sizes, replace(self.opts, ctx=key[1]), self.process_bytes)
        return self._plans[key]


def plan_load(opts: LoadOptions, files: PairFiles, process_bytes: int | None = None, answers: Answers | None = None,
              tokenizer: Tokenizer | None = None, status=None) -> LoadPlan:
    """How to load these files (see LoadPlan). A llama.cpp target that streams from disk first gets
    the drafter trimmed to its catalog's keep set (`trim_if_streaming`) and, with `answers` (and the
    target's `tokenizer`) and no --ctx, a context sized to them."""
    threads = opts.threads or default_threads()
    plans = MemoryPlans(files, opts, process_bytes)
    if opts.rpc is not None:  # llama.cpp places the split; the planner's profile is the split's own
        target, drafter = "llama", "llama" if opts.drafter_backend == "auto" else opts.drafter_backend
        n_ctx = rpc_context(opts, answers, tokenizer)
        return LoadPlan(files, opts, target, drafter, threads, n_ctx, plans.plan(target, drafter, n_ctx), plans.split)
    else:
        trim_if_streaming(files, opts, plans, status)  # the catalog's keep set: a smaller drafter, more layers cached
        target, drafter = pick_backends(opts, files, threads, plans)
    memory, n_ctx = plans.plan(target, drafter), opts.context
    if opts.ctx is None and memory is not None and memory.streams and (answers or opts.streaming_ctx):
        n_ctx = min(DEFAULT_CTX, sized_context(tokenizer, answers, memory.sizes.max_tree) if answers else opts.streaming_ctx)
        memory = plans.plan(target, drafter, n_ctx)
    return LoadPlan(files, opts, target, drafter, threads, n_ctx, memory, plans.split)


def rpc_context(opts: LoadOptions, answers: Answers | None, tokenizer: Tokenizer | None) -> int:
    """A split target's context: --ctx, else sized to the answers (or chat's STREAMING_CHAT_CTX), as a
    streaming target's: each worker holds its layers' KV cells, room that holds layers otherwise."""
    if opts.ctx is not None or not (answers or opts.streaming_ctx):
        return opts.context
    return min(DEFAULT_CTX, sized_context(tokenizer, answers, RPC_MAX_TREE) if answers else opts.streaming_ctx)


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
    """The target on `backend`: the ONNX one (onnx/target.py), else as target/loader.py opens it,
    sized by `memory` (None: llama.cpp's defaults), its layers split across workers by `split`."""
    if backend == "onnx":
        from ondevice.onnx.target import (
            OnnxTarget,  # lazy: imports torch and ONNX Runtime (~1.4 s)
        )

        return OnnxTarget.from_gguf(path, n_ctx=n_ctx, threads=threads)
    sized = memory.llama_target_sizes() if memory is not None else None
    if split is not None:
        sized = {**(sized or {}), "split": split}
    if memory is not None and memory.streams:
        unmap_large_frees()  # the heap shares the limit with the kept layers: what it frees goes back
    return load_target(backend, path, n_ctx, threads, sized, opts.device, opts.gpu_memory, opts.ram_memory, largest_tree(on_gpu=False))


def pick_backends(opts: LoadOptions, files: PairFiles, threads: int, plans: MemoryPlans) -> tuple[str, str]:
    """(target backend, drafter backend): what was asked for, else the fastest pair this machine has
    measured for the pair (plan/backends.py, from the saved profile), else llama.cpp on a CPU and
    torch on a GPU. `ondevice profile` measures every backend, so auto can choose after it. Where the
    target streams from disk, the drafters that leave it the most RAM (`leanest_drafters`) are
    measured (each alone, before anything is loaded) and the faster one drafts."""
    target = None if opts.target_backend == "auto" else opts.target_backend
    drafter = None if opts.drafter_backend == "auto" else opts.drafter_backend
    if target is None and pick_backend("auto") == "torch":
        target = "torch"  # a GPU: the offloaded torch target (its profile is another key)
    if target is None or drafter is None:
        planned = (target or "llama", drafter or "llama")
        drafters = CPU_BACKENDS
        memory = plans.plan(*planned)
        if drafter is None and files.drafter is not None and memory is not None and memory.streams:
            drafters = leanest_drafters(plans, planned[0])
            drafter = drafters[0] if len(drafters) == 1 else None
            planned = (planned[0], drafter or "llama")
            memory = plans.plan(*planned)
        trial = LoadPlan(files, opts, *planned, threads, opts.context, memory)
        backends = profile_backends(trial, drafters=drafters)
        if drafter is None and files.drafter is not None and trial.streams:
            saved = streaming_profile(trial, drafters, compare=True) or get_profile(backends, compare=True)[0]
        else:
            saved = load_profile(machine_facts(home()), backends)
        choice = best_backends(saved, AcceptanceTracker.load(files.name).p_rank, target, drafter)
        if choice is not None:
            target, drafter = target or choice.target, drafter or choice.drafter
    return target or pick_backend("auto"), drafter or "llama"


def streaming_profile(plan: LoadPlan, drafters=CPU_BACKENDS, compare: bool = False):
    """The saved profile of a pair whose target streams from disk, measured first in a child process
    when none is saved (None if that failed: the caller measures here). Measured in this process, a
    profile leaves memory the plan does not count — llama.cpp's buffers grown for the largest batches
    it probes, ONNX Runtime's when another drafter is compared — and the kernel then evicts the
    layers the plan keeps cached (README, "Larger than memory", item 5). A child's memory goes when
    it exits. The child times the target as this load will run it (the same memory plan: its trees'
    sizes, its kept layers) where it can: it holds one model at a time, and while it times the target
    the drafter's room holds its own interpreter. Planned again within what is left, a child under
    0.9 GB gave up tree size for the LM head and timed passes of up to 8 tokens, and the planner
    could then price no tree larger than 7 nodes where trees of 15 ran 1.3x faster."""
    facts, backends = machine_facts(home()), profile_backends(plan, drafters=drafters)
    found = load_profile(facts, backends)
    measured = child_plan(plan)
    timed = found.targets.get(plan.target_backend) if found is not None else None
    stale = timed is not None and measured is plan and not times_trees_of(timed, plan.memory.sizes.max_tree)
    if timed is not None and plan.drafter_backend in found.drafters and not stale:
        return found
    child = multiprocessing.get_context("spawn").Process(
        target=_measure_streaming, args=(measured, plan.memory.process_bytes, drafters, compare, stale), name="ondevice-profile"
    )
    child.start()
    child.join()
    return load_profile(facts, backends) if child.exitcode == 0 else None


def child_plan(plan: LoadPlan) -> LoadPlan:
    """The plan the streaming profile's child times under: this load's own where the drafter's room
    holds the child's interpreter (the child holds one model at a time), else one made within what
    this process leaves while it waits (`memory` None: the child plans it)."""
    if plan.memory.drafter_bytes >= plan.memory.process_bytes:
        return plan
    left = replace(plan.options, ram_memory=max(1, plan.memory.budget.bytes - plan.memory.process_bytes))
    return replace(plan, options=left, memory=None)


def times_trees_of(curve, max_tree: int) -> bool:
    """Whether a streaming target's timed passes reach the trees a load plans (`max_tree` nodes), or
    stopped short only where no tree could pay (latency.worth_timing): a profile timed under another
    plan's smaller buffers leaves the planner unable to price the trees this one can verify."""
    return curve.max_n >= max_tree or curve(curve.max_n) > MAX_TOKENS_PER_PASS * curve(curve.ns[0])


def _measure_streaming(plan: LoadPlan, process_bytes: int, drafters, compare: bool, refresh: bool = False) -> None:
    """In the child process of `streaming_profile`: measure and save the profile, with the parent's
    memory plan, or planned as the parent plans (the same process size) within what it leaves;
    `refresh`: measured anew (the saved profile's passes stop short of the plan's trees)."""
    try:
        memory = plan.memory or MemoryPlans(plan.files, plan.options, process_bytes).plan(plan.target_backend, plan.drafter_backend, plan.n_ctx)
        get_profile(profile_backends(replace(plan, memory=memory), drafters=drafters), refresh=refresh, compare=compare)
    except Exception as err:  # noqa: BLE001 - one line; the parent measures in its own process instead
        print(f"ondevice: measuring the streaming profile apart failed ({err}); the main process measures it", file=sys.stderr)
        sys.exit(1)


def time_alone(lean: LoadPlan) -> AlonePass:
    """The target's 1-token pass as `lean` (the load without the drafter) plans it: what the drafter's
    RAM is weighed against (plan/drafter_room.py). Timed here, before anything else is loaded, as
    the profile times passes: the plan the load would run, where a child process (the streaming
    profile's) would have less room, its own interpreter beside this one's (measured under 1.2 GB:
    16 layers kept and 0.25 s per pass there; 19 and 0.18–0.21 s in this process at other minutes)."""
    memory = lean.memory
    largest = MAX_LOOKUP_BUDGET + 1 if memory is None else min(memory.sizes.max_tree, MAX_LOOKUP_BUDGET + 1)
    target = lean.open_target()
    try:  # every size a sized free round can pass (the planner's curve without the drafter), 1-3 s here
        timing, _ = measure_target_timing(target, ns=pass_sizes(largest), context_tokens=ALONE_CONTEXT, show=False, prune=False)
    finally:
        target.close()
        return_freed_memory()
    in_ram = memory is None or memory.target_in_ram
    return AlonePass(timing.seconds(1), 0 if memory is None else memory.bytes_read_per_pass,
                     0 if memory is None else memory.kept_layer_count, in_ram, timing.busy, curve=timing.curve.to_dict())


def trim_if_streaming(files: PairFiles, opts: LoadOptions, plans: MemoryPlans, status=None) -> None:
    """Where a llama.cpp target will stream from disk, write the drafter trimmed to the keep set its
    catalog entry ships (once, seconds): a smaller drafter leaves more of the target cached. Before
    the backends are chosen, so that the choice and the profile see the drafter that will draft."""
    if not opts.vocab_trim or files.drafter is None or opts.drafter_backend == "onnx" or pick_backend(opts.target_backend) != "llama":
        return
    memory = plans.plan("llama", "llama")
    if memory is not None and memory.streams:
        trim_for_streaming(files.name, files.drafter, files.drafter_sha256, status)


def leanest_drafters(plans: MemoryPlans, target: str) -> tuple[str, ...]:
    """For a target that streams from disk: the drafter backends whose memory plan reads the fewest
    bytes per pass. A streamed pass costs about the bytes it reads, and every byte a drafter holds
    in RAM is one more the target reads again each pass, which no faster drafting wins back (README,
    "Larger than memory", item 4: a faster but larger drafter). Drafters that leave
    the same are compared by their measured speed."""
    candidates = [d for d in CPU_BACKENDS if d != "onnx" or onnx_drafter_built(plans.files.drafter, plans.opts.vocab_trim)]
    reads = {d: plans.plan(target, d).bytes_read_per_pass for d in candidates}
    least = min(reads.values())
    return tuple(d for d in candidates if reads[d] == least)


def onnx_drafter_built(path: Path, vocab_trim: bool) -> bool:
    """Whether the ONNX drafter of this GGUF is exported already. Exporting it peaks at ~3x the file in
    RAM (1.6 GB for the default pair's 0.5B): where the target streams, that would be killed by the
    limit it streams under (0.9 GB), so there the ONNX drafter is compared only once built."""
    head = TrimmedHead.find(path) if vocab_trim else None
    return drafter_export_built(path, head.keep_ids if head else None)


def sized_context(tokenizer: Tokenizer, answers: Answers, max_tree: int) -> int:
    """The context a streaming target needs for these prompts (chat-formatted or raw, whichever is
    longer) and their answers: its KV cache then takes what they use, not DEFAULT_CTX's cells."""
    longest = max(len(tokenizer.encode_chat(p)) if not isinstance(p, str)  # a conversation (bench's agent set)
                  else max(len(tokenizer.encode_user(p)), len(tokenizer.encode(p, add_special=True))) for p in answers.prompts)
    return answer_context(longest, answers.max_tokens, max_tree)


def plan_for(target: ModelSize, drafter: ModelSize | None, opts: LoadOptions, process_bytes: int | None = None) -> MemoryPlan:
    """The memory plan for a llama.cpp target and drafter of these sizes, within --ram-memory or the
    RAM this process may use (also for models that exist only as sizes: synthetic, not downloaded)."""
    budget = ram_budget()
    if opts.ram_memory is not None and parse_size(opts.ram_memory) < budget.bytes:  # --ram-memory: the user's budget
        budget = RamBudget(parse_size(opts.ram_memory), "--ram-memory")
    tree_nodes = (opts.free_tree_nodes or FREE_TREE_NODES) if drafter is None else None  # no drafter model: free trees only
    return plan_memory(target, drafter, n_ctx=opts.context, budget=budget, ahead=WINDOW_AHEAD, process_bytes=process_bytes,
                       tree_nodes=tree_nodes)


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


def profile_backends(plan: LoadPlan, make_target=None, make_decode_batch=None, drafters: tuple[str, ...] = CPU_BACKENDS,
                     lean_curve=None):
    """What the profile measures: the loaded target and drafter (factories given; default: opened as
    planned), and the other CPU backends `ondevice profile` compares them with (of `drafters`). One
    profile file per pair and machine setup ("cpu-t2", "cuda-t16"; "cpu-t2-stream" when the memory
    plan streams the target from disk, another regime): every backend's curves live in it."""
    files, target, drafter, threads, memory = plan.files, plan.target_backend, plan.drafter_backend, plan.threads, plan.memory
    on_gpu = target == "torch" and cuda_available()
    spare_cores = physical_cores() >= 2 * threads  # the drafter would not take the target's cores
    model_files = [(files.target, files.target_sha256)] + ([(files.drafter, files.drafter_sha256)] if files.drafter else [])
    others_t = {name: (lambda name=name: plan.open_target(name)) for name in CPU_BACKENDS if name != target}
    others_d = {} if files.drafter is None else {
        name: (lambda name=name: plan.open_drafter(name).probe_batch) for name in drafters if name != drafter
    }  # fmt: skip
    if plan.streams or plan.split is not None:  # another target would not run within the plan (or on the workers);
        others_t = {}  # another drafter is measured alone (pick_backends)
    sized_drafter = lambda: plan.open_drafter().probe_batch  # noqa: E731
    return ProfileBackends(
        pair=files.name, backend=backend_label(target, threads), model_files=model_files,
        make_target=make_target or plan.open_target,
        make_decode_batch=make_decode_batch if make_decode_batch or files.drafter is None else sized_drafter,
        overlap_possible=on_gpu or spare_cores, max_tree=min(largest_tree(on_gpu), memory.sizes.max_tree if memory else MAX_BUDGET),
        target_name=target, drafter_name=drafter, other_targets={} if on_gpu else others_t, other_drafters=others_d,
        key=f"{'cuda' if on_gpu else 'cpu'}-t{threads}" + ("-stream" if plan.streams else "") + (f"-{plan.split.key}" if plan.split else ""),
        memory=memory, profile_first=on_gpu,
        lean_curve=lean_curve,
    )  # fmt: skip


def load_backends(opts: LoadOptions):
    """What `ondevice profile` measures: the pair's files, the backends a chat would load, the others."""
    opts.checked()
    files = choose(opts.model, opts.target, opts.drafter, draft=True)
    if files.drafter is None:
        raise OndeviceError("`ondevice profile` measures a target and its drafter: pass --drafter FILE.")
    return profile_backends(plan_load(opts, files, anon_rss()))
