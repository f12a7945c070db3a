"""Planning a load, once: `plan_load` chooses the backends (asked, or the fastest this machine
measured), the threads, the context and the memory plan a llama.cpp target is placed and sized by,
and where the target would stream from disk with the drafter, the plan without it (`LoadPlan.lean`,
what loading/drafter_room.py weighs the drafter against). `ondevice profile` measures what
`load_backends` gives it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ondevice.catalog.choose import choose
from ondevice.catalog.hub import PairFiles
from ondevice.draft.requantized import write_requantized
from ondevice.errors import OndeviceError
from ondevice.loading.memory import MemoryPlan, answer_context
from ondevice.loading.options import CPU_BACKENDS, DEFAULT_CTX, Answers, LoadOptions
from ondevice.loading.plan import LoadPlan, MemoryPlans, pick_backend
from ondevice.loading.profiling import profile_backends, streaming_profile
from ondevice.loading.rpc_load import RPC_MAX_TREE
from ondevice.machine.facts import default_threads, machine_facts
from ondevice.machine.ram import anon_rss
from ondevice.onnx.export_files import drafter_export_built
from ondevice.paths import home
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.plan.backends import best_backends
from ondevice.plan.profile import get_profile, load_profile
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.vocabtrim.head import TrimmedHead
from ondevice.vocabtrim.shipped import trim_for_streaming


def plan_load(opts: LoadOptions, files: PairFiles, process_bytes: int | None = None, answers: Answers | None = None,
              tokenizer: Tokenizer | None = None, status=None, vocab_bytes: int = 0) -> LoadPlan:
    """How to load these files (see LoadPlan). A llama.cpp target that streams from disk first gets
    the drafter trimmed to its catalog's keep set and requantized (`shrink_drafter_if_streaming`)
    and, with `answers` (and the target's `tokenizer`) and no --ctx, a context sized to them; with
    the drafter (unless asked for it), the plan without it comes with it (`lean`): the same backends
    and threads, its memory planned from the same headers. vocab_bytes: the tokenizer's vocabulary, in
    process_bytes, let go of where the target streams (loading/memory.py's `plan_memory`)."""
    threads = opts.threads or default_threads()
    plans = MemoryPlans(files, opts, process_bytes, vocab_bytes)
    if opts.rpc is not None:  # llama.cpp places the split; the planner's profile is the split's own
        target, drafter = "llama", "llama" if opts.drafter_backend == "auto" else opts.drafter_backend
        n_ctx = rpc_context(opts, answers, tokenizer)
        return LoadPlan(files, opts, target, drafter, threads, n_ctx, plans.plan(target, drafter, n_ctx), plans.split)
    shrink_drafter_if_streaming(files, opts, plans, status)  # a smaller, faster drafter: more layers cached
    target, drafter = pick_backends(opts, files, threads, plans)
    memory, n_ctx = sized_memory(plans, target, drafter, answers, tokenizer)
    plan = LoadPlan(files, opts, target, drafter, threads, n_ctx, memory, plans.split)
    if plan.streams and files.drafter is not None and not opts.keep_drafter and opts.drafter is None:
        lean = plans.without_drafter()
        lean_memory, lean_ctx = sized_memory(lean, target, drafter, answers, tokenizer)
        plan = replace(plan, lean=replace(plan, files=lean.files, n_ctx=lean_ctx, memory=lean_memory))
    return plan


def rpc_context(opts: LoadOptions, answers: Answers | None, tokenizer: Tokenizer | None) -> int:
    """A split target's context: --ctx, else sized to the answers (or chat's STREAMING_CHAT_CTX), as a
    streaming target's: each worker holds its layers' KV cells, room that holds layers otherwise."""
    if opts.ctx is not None or not (answers or opts.streaming_ctx):
        return opts.context
    return min(DEFAULT_CTX, sized_context(tokenizer, answers, RPC_MAX_TREE) if answers else opts.streaming_ctx)


def sized_memory(plans: MemoryPlans, target: str, drafter: str, answers: Answers | None, tokenizer: Tokenizer | None) -> tuple[MemoryPlan | None, int]:
    """(memory plan, context): --ctx or DEFAULT_CTX, or where the target streams and the answers are
    known, the context they need; without them, the command's own streaming context (a chat's),
    shortened where that keeps the LM head in RAM (`head_keeping_context`)."""
    opts = plans.opts
    memory, n_ctx = plans.plan(target, drafter), opts.context
    streams = opts.ctx is None and memory is not None and memory.streams
    if streams and answers:
        n_ctx = min(DEFAULT_CTX, sized_context(tokenizer, answers, memory.sizes.max_tree))
    elif streams and opts.streaming_ctx:
        n_ctx = head_keeping_context(plans, target, drafter, min(DEFAULT_CTX, opts.streaming_ctx))
    else:
        return memory, n_ctx
    return plans.plan(target, drafter, n_ctx), n_ctx


def head_keeping_context(plans: MemoryPlans, target: str, drafter: str, longest: int) -> int:
    """A streaming target's context when the answers are not known (a chat): `longest`, else the
    longest of ¾ and ½ of it whose plan keeps the LM head in RAM (`MemoryPlan.head_in_ram`): a head
    that streams is read whole every pass and sends every layer through the page cache, which costs
    more than the older turns the shorter context drops. `longest` where none keeps it."""
    for n_ctx in (longest, longest * 3 // 4, longest // 2):
        if plans.plan(target, drafter, n_ctx).head_in_ram:
            return n_ctx
    return longest


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


def shrink_drafter_if_streaming(files: PairFiles, opts: LoadOptions, plans: MemoryPlans, status=None) -> None:
    """Where a llama.cpp target will stream from disk, write once the drafter trimmed to the keep set
    its catalog entry ships (seconds), then the file the llama.cpp drafter loads requantized for
    llama.cpp's repacked kernels where that pays here (draft/requantized.py; half a minute for the
    default drafter on two cores): a smaller drafter leaves
    more of the target cached, a faster one shortens every round. Before the backends are chosen, so
    that the choice and the profile see the drafter that will draft."""
    if files.drafter is None or opts.drafter_backend == "onnx" or pick_backend(opts.target_backend) != "llama":
        return
    memory = plans.plan("llama", "llama")
    if memory is None or not memory.streams:
        return
    if opts.vocab_trim:
        trim_for_streaming(files.name, files.drafter, files.drafter_sha256, status)
    write_requantized(plans.drafter_file(requantized=False), status)


def leanest_drafters(plans: MemoryPlans, target: str) -> tuple[str, ...]:
    """For a target that streams from disk: the drafter backends whose memory plan reads the fewest
    bytes per pass. A streamed pass costs about the bytes it reads, and every byte a drafter holds
    in RAM is one more the target reads again each pass, which no faster drafting wins back (README,
    "Larger than memory", item 4: a faster but larger drafter). Of those, the ones whose plan holds the
    least in RAM: where every plan reads the whole file (its LM head streamed too), a larger drafter
    only takes what the pass's pages need. Drafters that leave the same are compared by their measured speed."""
    candidates = [d for d in CPU_BACKENDS if d != "onnx" or onnx_drafter_built(plans.files.drafter, plans.opts.vocab_trim)]
    planned = {d: plans.plan(target, d) for d in candidates}
    cost = {d: (p.bytes_read_per_pass, p.resident_bytes) for d, p in planned.items()}
    least = min(cost.values())
    return tuple(d for d in candidates if cost[d] == least)


def onnx_drafter_built(path: Path, vocab_trim: bool) -> bool:
    """Whether the ONNX drafter of this GGUF is exported already. Exporting it peaks at several times
    the file in RAM (docs/measurements/code-notes.md): where the target streams, that would be killed
    by the limit it streams under, so there the ONNX drafter is compared only once built."""
    head = TrimmedHead.find(path) if vocab_trim else None
    return drafter_export_built(path, head.keep_ids if head else None)


def sized_context(tokenizer: Tokenizer, answers: Answers, max_tree: int) -> int:
    """The context a streaming target needs for these prompts (chat-formatted or raw, whichever is
    longer) and their answers: its KV cache then takes what they use, not DEFAULT_CTX's cells."""
    with tokenizer.held():  # one load of a vocabulary it let go of
        longest = max(len(tokenizer.encode_chat(p)) if not isinstance(p, str)  # a conversation (bench's agent set)
                      else max(len(tokenizer.encode_user(p)), len(tokenizer.encode(p, add_special=True))) for p in answers.prompts)
    return answer_context(longest, answers.max_tokens, max_tree)


def load_backends(opts: LoadOptions):
    """What `ondevice profile` measures: the pair's files, the backends a chat would load, the others."""
    opts.checked()
    files = choose(opts.model, opts.target, opts.drafter, draft=True)
    if files.drafter is None:
        raise OndeviceError("`ondevice profile` measures a target and its drafter: pass --drafter FILE.")
    return profile_backends(plan_load(opts, files, anon_rss()))
