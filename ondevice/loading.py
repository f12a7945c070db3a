"""Loading a pair: the options, the backends chosen (`pick_backends`: asked, or the fastest this
machine measured), the memory plan a llama.cpp target is placed and sized by (`memory_plan`), and
the target and drafter each backend loads. `pipeline.load_pipeline` wires them into a Pipeline;
`ondevice profile` measures what `load_backends` gives it.
"""

from __future__ import annotations

import multiprocessing
import sys
from dataclasses import dataclass, replace

from ondevice.catalog import refs
from ondevice.catalog.choose import Models, choose
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.draft.router import DraftRouter
from ondevice.vocabtrim.head import TrimmedHead
from ondevice.errors import OndeviceError
from ondevice.machine.facts import cuda_available, default_threads, machine_facts, physical_cores
from ondevice.machine.ram import RamBudget, anon_rss, ram_budget
from ondevice.paths import home
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.plan.auto import CPU_MAX_TREE
from ondevice.plan.backends import best_backends
from ondevice.plan.memory import MemoryPlan, ModelSize, answer_context, plan_memory
from ondevice.plan.profile import ProfileBackends, get_profile, load_profile
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.protocols import MAX_BUDGET
from ondevice.vocabtrim.shipped import trim_for_streaming
from ondevice.sizes import parse_size
from ondevice.target.llama_target import LlamaTarget
from ondevice.target.page_cache import WINDOW_AHEAD

DEFAULT_CTX = 4096  # tokens of context unless --ctx, or a streaming target answering known prompts (`sized_context`)
TARGET_BACKENDS = ("auto", "torch", "llama", "onnx")
DRAFTER_BACKENDS = ("auto", "llama", "onnx")
CPU_BACKENDS = ("llama", "onnx")  # what the profile compares on a CPU (`ondevice profile`), and auto picks among


@dataclass
class LoadOptions:
    pair: str | None = None
    target: str | None = None  # a GGUF file or hf:owner/repo[:QUANT | /file.gguf] instead of the pair's target
    drafter: str | None = None  # the same for the drafter; default: the pair's, or one found automatically
    target_backend: str = "auto"
    drafter_backend: str = "auto"
    draft: bool = True
    vocab_trim: bool = True
    threads: int | None = None
    n_ctx: int | None = None  # None: DEFAULT_CTX, or when a llama.cpp target streams, sized to `prompts`
    prompts: tuple = ()  # what this load will answer, when known (generate, bench: strings or conversations) ...
    max_tokens: int = 0  # ... and at most how many tokens each answer has
    device: str | None = None  # torch target: "cpu" / "cuda"; default: cuda if available
    gpu_memory: str | None = None
    ram_memory: str | None = None
    overlap: bool | None = None  # draft while the target verifies; None: when the target is on a GPU

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
        if self.n_ctx is not None and self.n_ctx < 16:
            raise OndeviceError(f"--ctx must be at least 16 tokens (got {self.n_ctx}).")
        for flag, ref in (("--target", self.target), ("--drafter", self.drafter)):
            if ref is not None:
                refs.check(ref, flag)
        if self.drafter is not None and not self.draft:
            raise OndeviceError("--drafter and --no-draft contradict each other; drop one.")
        return self

    @property
    def context(self) -> int:
        """The context window in tokens: --ctx, else DEFAULT_CTX (load_pipeline may size it)."""
        return self.n_ctx or DEFAULT_CTX


def pick_backend(name: str) -> str:
    if name != "auto":
        return name
    return "torch" if cuda_available() else "llama"  # on a CPU-only machine llama.cpp is the fast target


def _load_target(backend: str, path, opts: LoadOptions, threads: int, memory: MemoryPlan | None = None):
    if backend == "llama":
        if memory is None:
            return LlamaTarget(path, n_ctx=opts.context, threads=threads)
        return LlamaTarget(path, n_ctx=opts.context, threads=threads, max_tree_nodes=memory.sizes.max_tree,
                           n_ubatch=memory.sizes.target_ubatch, streams=memory.streams, window=memory.ahead, kv_type=memory.kv_type,
                           kept_layers=memory.kept_layers(memory.ahead))
    if backend == "onnx":
        from ondevice.onnx.target import OnnxTarget  # lazy: imports torch and ONNX Runtime (~1.4 s)

        return OnnxTarget.from_gguf(path, n_ctx=opts.context, threads=threads)
    import torch  # lazy: torch (~1 s) only for the torch target

    from ondevice.target.torch_target import TorchTarget  # lazy: imports torch

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") or opts.gpu_memory or opts.ram_memory:  # place layers within the budgets
        from ondevice.target.offloaded import load_offloaded_target  # lazy: imports torch

        return load_offloaded_target(
            path, device, n_ctx=opts.context, threads=threads, gpu_memory=opts.gpu_memory, ram_memory=opts.ram_memory,
            max_tree=_largest_tree(device.startswith("cuda")),
        )
    return TorchTarget.from_gguf(path, device=device, n_ctx=opts.context, threads=threads)


def _load_drafter(backend: str, path, opts: LoadOptions, threads: int, target_vocab: int | None = None, vocab_trim: bool | None = None,
                  memory: MemoryPlan | None = None):
    """The drafter; a llama.cpp one has its buffers sized by the memory plan, and its weights
    resident (read, not mapped) when the target streams."""
    vocab_trim = opts.vocab_trim if vocab_trim is None else vocab_trim
    if backend == "onnx":
        from ondevice.draft.onnx_drafter import OnnxDrafter  # lazy: imports torch and ONNX Runtime

        return OnnxDrafter(path, n_ctx=opts.context, threads=threads, vocab_trim=vocab_trim, target_vocab=target_vocab)
    sized = {} if memory is None else {"max_tree": memory.sizes.max_tree, "resident": memory.streams, "kv_type": memory.kv_type,
                                       "n_batch": memory.sizes.drafter_ubatch}
    return LlamaDrafter(path, n_ctx=opts.context, threads=threads, vocab_trim=vocab_trim, target_vocab=target_vocab, **sized)


def pick_backends(opts: LoadOptions, models: Models, threads: int) -> tuple[str, str]:
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
        memory = memory_plan(models, opts, *planned)
        drafters = CPU_BACKENDS
        if drafter is None and models.drafter is not None and memory is not None and memory.streams:
            drafters = leanest_drafters(models, opts, planned[0])
            drafter = drafters[0] if len(drafters) == 1 else None
            planned = (planned[0], drafter or "llama")
            memory = memory_plan(models, opts, *planned)
        backends = _profile_backends(models, *planned, threads, opts, memory=memory, drafters=drafters)
        if drafter is None and models.drafter is not None and backends.memory is not None and backends.memory.streams:
            saved = streaming_profile(models, planned, threads, opts, drafters, compare=True) or get_profile(backends, compare=True)[0]
        else:
            saved = load_profile(machine_facts(home()), backends)
        choice = best_backends(saved, AcceptanceTracker.load(models.name).p_rank, target, drafter)
        if choice is not None:
            target, drafter = target or choice.target, drafter or choice.drafter
    return target or pick_backend("auto"), drafter or "llama"


def streaming_profile(models: Models, planned: tuple[str, str], threads: int, opts: LoadOptions, drafters=CPU_BACKENDS,
                      compare: bool = False):
    """The saved profile of a pair whose target streams from disk, measured first in a child process
    when none is saved (None if that failed: the caller measures here). Measured in this process, a
    profile leaves memory the plan does not count — llama.cpp's buffers grown for the largest batches
    it probes, ONNX Runtime's when another drafter is compared — and the kernel then evicts the
    layers the plan keeps cached (README, "Larger than memory", item 5). A child's memory goes when
    it exits."""
    plan = memory_plan(models, opts, *planned)
    facts, backends = machine_facts(home()), _profile_backends(models, *planned, threads, opts, memory=plan, drafters=drafters)
    found = load_profile(facts, backends)
    if found is not None and planned[0] in found.targets and planned[1] in found.drafters:
        return found
    left = replace(opts, ram_memory=max(1, plan.budget.bytes - plan.process_bytes))  # what is left while this process waits
    child = multiprocessing.get_context("spawn").Process(
        target=_measure_streaming, args=(models, planned, threads, left, plan.process_bytes, drafters, compare), name="ondevice-profile"
    )
    child.start()
    child.join()
    return load_profile(facts, backends) if child.exitcode == 0 else None


def _measure_streaming(models: Models, planned: tuple[str, str], threads: int, opts: LoadOptions, process_bytes: int, drafters,
                       compare: bool) -> None:
    """In the child process of `streaming_profile`: measure and save the profile, planned as the
    parent plans (the same process size) within what the parent leaves."""
    try:
        memory = memory_plan(models, opts, *planned, process_bytes=process_bytes)
        get_profile(_profile_backends(models, *planned, threads, opts, memory=memory, drafters=drafters), compare=compare)
    except Exception as err:  # noqa: BLE001 - one line; the parent measures in its own process instead
        print(f"ondevice: measuring the streaming profile apart failed ({err}); the main process measures it", file=sys.stderr)
        sys.exit(1)


def trim_if_streaming(models: Models, opts: LoadOptions, status=None) -> None:
    """Where a llama.cpp target will stream from disk, write the drafter trimmed to the keep set its
    catalog entry ships (once, seconds): a smaller drafter leaves more of the target cached. Before
    the backends are chosen, so that the choice and the profile see the drafter that will draft."""
    if not opts.vocab_trim or models.drafter is None or opts.drafter_backend == "onnx" or pick_backend(opts.target_backend) != "llama":
        return
    memory = memory_plan(models, opts, "llama", "llama")
    if memory is not None and memory.streams:
        trim_for_streaming(models.name, models.drafter, models.drafter_sha256, status)


def leanest_drafters(models: Models, opts: LoadOptions, target: str) -> tuple[str, ...]:
    """For a target that streams from disk: the drafter backends whose memory plan reads the fewest
    bytes per pass. A streamed pass costs about the bytes it reads, and every byte a drafter holds
    in RAM is one more the target reads again each pass, which no faster drafting wins back (README,
    "Larger than memory", item 4: a faster but larger drafter). Drafters that leave the same are
    compared by their measured speed."""
    reads = {d: memory_plan(models, opts, target, d).bytes_read_per_pass for d in CPU_BACKENDS}
    least = min(reads.values())
    return tuple(d for d in CPU_BACKENDS if reads[d] == least)


def _largest_tree(on_gpu: bool) -> int:
    """The largest target pass to profile and place for: as many nodes as any draft may hold on a
    GPU; fewer on a CPU, where the pass cost grows steeply with the tree."""
    return MAX_BUDGET if on_gpu else CPU_MAX_TREE


def sized_context(tokenizer: Tokenizer, prompts, max_tokens: int, max_tree: int) -> int:
    """The context a streaming target needs for these prompts (chat-formatted or raw, whichever is
    longer) and their answers: its KV cache then takes what they use, not DEFAULT_CTX's cells."""
    longest = max(len(tokenizer.encode_chat(p)) if not isinstance(p, str)  # a conversation (bench's agent set)
                  else max(len(tokenizer.encode_user(p)), len(tokenizer.encode(p, add_special=True))) for p in prompts)
    return answer_context(longest, max_tokens, max_tree)


def memory_plan(models: Models, opts: LoadOptions, backend: str, drafter_backend: str = "llama", process_bytes: int | None = None) -> MemoryPlan | None:
    """Where a llama.cpp target lives (RAM or streamed from disk) and how its buffers (and the
    drafter's) are sized, within --ram-memory or the RAM this process may use; None for the torch
    and ONNX targets, which plan their own memory."""
    if backend != "llama":
        return None
    drafter = None
    if models.drafter is not None:  # an ONNX drafter is counted as its GGUF (its 4-bit export is smaller)
        head = TrimmedHead.find(models.drafter) if opts.vocab_trim and drafter_backend == "llama" else None
        drafter = ModelSize.from_gguf(head.gguf_path if head else models.drafter)
    return plan_for(ModelSize.from_gguf(models.target), drafter, opts, process_bytes)


def plan_for(target: ModelSize, drafter: ModelSize | None, opts: LoadOptions, process_bytes: int | None = None) -> MemoryPlan:
    """The memory plan for a llama.cpp target and drafter of these sizes, within --ram-memory or the
    RAM this process may use (also for models that exist only as sizes: synthetic, not downloaded)."""
    budget = ram_budget()
    if opts.ram_memory is not None and parse_size(opts.ram_memory) < budget.bytes:  # --ram-memory: the user's budget
        budget = RamBudget(parse_size(opts.ram_memory), "--ram-memory")
    return plan_memory(target, drafter, n_ctx=opts.context, budget=budget, ahead=WINDOW_AHEAD, process_bytes=process_bytes)


def _with_lookup(drafter, n_vocab: int, draft: bool = True):
    """The drafter model (None if there is none) and the free prompt-lookup drafter behind one router
    (by spec.builder). None for --no-draft: the target alone, the reference every test compares to."""
    if not draft:
        return None
    return DraftRouter(drafter, PromptLookupDrafter(n_vocab))


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
        return backend_label(backend, threads), _load_drafter(backend, path, opts, threads, vocab_trim=False)
    backend = pick_backend(opts.target_backend)
    return backend_label(backend, threads), _load_target(backend, path, opts, threads, memory)


def _profile_backends(models: Models, target: str, drafter: str, threads: int, opts: LoadOptions, make_target=None, make_decode_batch=None,
                      memory: MemoryPlan | None = None, drafters: tuple[str, ...] = CPU_BACKENDS):
    """What the profile measures: the loaded target and drafter (factories given), and the other
    CPU backends `ondevice profile` compares them with (of `drafters`). One profile file per pair and machine setup
    ("cpu-t2", "cuda-t16"; "cpu-t2-stream" when the memory plan streams the target from disk, another
    regime): every backend's curves live in it."""
    on_gpu = target == "torch" and cuda_available()
    streams = memory is not None and memory.streams
    spare_cores = physical_cores() >= 2 * threads  # the drafter would not take the target's cores
    files = [(models.target, models.target_sha256)] + ([(models.drafter, models.drafter_sha256)] if models.drafter else [])
    others_t = {name: (lambda name=name: _load_target(name, models.target, opts, threads)) for name in CPU_BACKENDS if name != target}
    others_d = {} if models.drafter is None else {
        name: (lambda name=name: _load_drafter(name, models.drafter, opts, threads).probe_batch) for name in drafters if name != drafter
    }  # fmt: skip
    if streams:  # another target would not run within the plan; another drafter is measured alone (pick_backends)
        others_t = {}
    sized_drafter = lambda: _load_drafter(drafter, models.drafter, opts, threads, memory=memory).probe_batch  # noqa: E731
    return ProfileBackends(
        pair=models.name, backend=backend_label(target, threads), model_files=files,
        make_target=make_target or (lambda: _load_target(target, models.target, opts, threads, memory)),
        make_decode_batch=make_decode_batch if make_decode_batch or models.drafter is None else sized_drafter,
        overlap_possible=on_gpu or spare_cores, max_tree=min(_largest_tree(on_gpu), memory.sizes.max_tree if memory else MAX_BUDGET),
        target_name=target, drafter_name=drafter, other_targets={} if on_gpu else others_t, other_drafters=others_d,
        key=f"{'cuda' if on_gpu else 'cpu'}-t{threads}" + ("-stream" if streams else ""), memory=memory, profile_first=on_gpu,
    )  # fmt: skip


def load_backends(opts: LoadOptions):
    """What `ondevice profile` measures: the pair's files, the backends a chat would load, the others."""
    opts.checked()
    models = choose(opts.pair, opts.target, opts.drafter, draft=True)
    if models.drafter is None:
        raise OndeviceError("`ondevice profile` measures a target and its drafter: pass --drafter FILE.")
    threads = opts.threads or default_threads()
    process = anon_rss()
    trim_if_streaming(models, opts)
    target, drafter = pick_backends(opts, models, threads)
    return _profile_backends(models, target, drafter, threads, opts, memory=memory_plan(models, opts, target, drafter, process_bytes=process))

