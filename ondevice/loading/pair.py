"""The load sequence: choose the files, plan the load once (loading/choices.py), keep the drafter or
give its RAM to a streaming target's layers (loading/drafter_room.py), open the target and drafter as
planned (targets/loader.py, draft/loader.py) and wire them into the decode engine. pipeline.py makes
the running `Pipeline` of what this opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ondevice.catalog.choose import choose
from ondevice.catalog.hub import PairFiles
from ondevice.draft import cross_vocab
from ondevice.draft.loader import with_lookup
from ondevice.decode.engine import SpecEngine
from ondevice.loading.choices import plan_load
from ondevice.loading.drafter_room import DrafterChoice, drafter_or_layers, drafterless_curve, yardstick
from ondevice.loading.options import Answers, LoadOptions
from ondevice.loading.plan import LoadPlan, streams_surely
from ondevice.loading.rpc_load import profile_split
from ondevice.loading.profiling import profile_backends, streaming_profile
from ondevice.machine.ram import anon_rss, return_freed_memory, trim_heap
from ondevice.plan.profile import ProfileBackends
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.targets.llama_target import LlamaTarget


@dataclass
class OpenPair:
    """A pair opened as planned: its models wired into the engine, and how they were placed."""

    files: PairFiles
    tokenizer: Tokenizer
    engine: SpecEngine
    plan: LoadPlan
    backends: ProfileBackends
    choice: DrafterChoice | None  # a target streaming from disk: the drafter kept or left out, and why
    placement: str  # the memory plan's description ("target in RAM: …"), or the target's placement summary
    info: dict


def open_pair(opts: LoadOptions, status: Callable[[str], None] | None = None, answers: Answers | None = None) -> OpenPair:
    """Choose the files, plan the load, open the target and drafter as planned, wire them.
    status(message): what a long step is doing (the CLI's spinner)."""
    opts.checked()
    files = choose(opts.model, opts.target, opts.drafter, opts.draft)  # downloads on first use
    tokenizer = Tokenizer(files.target)
    other = cross_vocab.other_tokenizer(files.drafter, tokenizer)  # a drafter of another tokenizer: its own, used while drafting
    process = anon_rss()  # before plan_load may measure (and free) models: the plan is the same every run
    vocab = 0
    if other is None and process is not None and opts.rpc is None and streams_surely(files.target, opts, process):
        tokenizer.let_go()  # nothing encodes while decoding, and a streaming target holds no vocabulary
        vocab = max(0, process - anon_rss())  # what that freed, measured: the memory plan gives it to a streaming target
    plan = plan_load(opts, files, process, answers, tokenizer, status, vocab_bytes=vocab)
    choice, lean_curve, speed = None, None, None
    if plan.streams and files.drafter is not None:  # with the drafter asked for too: its profile is measured apart
        profile = streaming_profile(plan)  # measured apart: see there
        plan, choice = drafter_or_layers(plan, profile, status)
        files, lean_curve, speed = plan.files, drafterless_curve(profile, plan), yardstick(profile)
    drafter = None
    if files.drafter is not None:
        drafter = cross_vocab.open_drafter(plan, tokenizer, other, status)  # another tokenizer: drafts the tokens both hold
    elif other is not None:
        other.tokenizer.close()  # the drafter was left out
    target = plan.open_target()
    if isinstance(target, LlamaTarget) and target.model.has_vocab:
        tokenizer.read_from(target.model)  # one copy of its vocabulary in RAM, as the plan counted
        trim_heap()  # and the freed copy handed back to the OS (the page cache's room)
    backends = profile_backends(plan, lambda: target, (lambda: drafter.probe_batch) if drafter else None, lean_curve=lean_curve,
                                yardstick=speed)
    if plan.split is not None and drafter is not None:  # a split's passes: its own curve, timed once (rpc_load.py)
        profile_split(backends, status)
    overlap = backends.overlap_possible if opts.overlap is None else opts.overlap  # on a CPU without spare cores both would fight for them
    engine = SpecEngine(target, with_lookup(drafter, target.n_vocab) if opts.draft else None, tokenizer.is_end, overlap=overlap)
    repacked = getattr(target, "marks", None) is not None  # streamed from its copy in llama.cpp's repacked layouts
    placement = target.placement_summary() if plan.memory is None else plan.memory.describe(repacked)
    info = {"threads": plan.threads, "drafter_backend": plan.drafter_backend if drafter else None, "repacked_stream": repacked}
    return_freed_memory()  # what loading allocated and freed (timed passes, the held drafter's copy) back to the OS: the plan counted the process before it
    return OpenPair(files, tokenizer, engine, plan, backends, choice, placement, info)
