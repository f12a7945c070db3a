"""The timed passes a load decides on: what the profile measures (`profile_backends`: the backends
as planned, and the others `ondevice profile` compares them with), and a streaming target's profile
measured in a child process (`streaming_profile`). The saved profiles live in plan/profile.py.
"""

from __future__ import annotations

import multiprocessing
import sys
from dataclasses import replace

from ondevice.loading.options import CPU_BACKENDS
from ondevice.loading.plan import LoadPlan, MemoryPlans, backend_label, largest_tree
from ondevice.machine.facts import cuda_available, machine_facts, physical_cores
from ondevice.paths import home
from ondevice.plan.latency import MAX_TOKENS_PER_PASS
from ondevice.plan.profile import ProfileBackends, get_profile, load_profile
from ondevice.decode.protocols import MAX_BUDGET


def profile_backends(plan: LoadPlan, make_target=None, make_decode_batch=None, drafters: tuple[str, ...] = CPU_BACKENDS,
                     lean_curve=None, key: str | None = None, yardstick=None):
    """What the profile measures: the loaded target and drafter (factories given; default: opened as
    planned), and the other CPU backends `ondevice profile` compares them with (of `drafters`). One
    profile file per pair and machine setup ("cpu-t2", "cuda-t16"; "cpu-t2-stream" when the memory
    plan streams the target from disk, another regime, `streaming_key`; `key` gives it instead): every
    backend's curves live in it."""
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
        key=key or f"{'cuda' if on_gpu else 'cpu'}-t{threads}" + streaming_key(memory) + (f"-{plan.split.key}" if plan.split else ""),
        memory=memory, profile_first=on_gpu,
        lean_curve=lean_curve, yardstick=yardstick,
    )  # fmt: skip


def streaming_key(memory) -> str:
    """The regime part of a profile's key: "" in RAM (or no memory plan), "-stream" where the target
    streams with its LM head kept, "-stream-paged" where the head streams too: every layer then goes
    through the page cache, whose passes compute slower and read more, so neither the curves nor the
    rates the planner's book measured with the head kept hold there (a chat or server at a context
    that left the head out kept the drafter on rates measured with it kept, and ran slower than
    without it: docs/measurements/2026-12-05-streaming-chat-context.md)."""
    if memory is None or not memory.streams:
        return ""
    return "-stream" if memory.head_in_ram else "-stream-paged"


def streaming_profile(plan: LoadPlan, drafters=CPU_BACKENDS, compare: bool = False):
    """The saved profile of a pair whose target streams from disk, measured first in a child process
    when none is saved (None if that failed: the caller measures here). Measured in this process, a
    profile leaves memory the plan does not count — llama.cpp's buffers grown for the largest batches
    it probes, ONNX Runtime's when another drafter is compared — and the kernel then evicts the
    layers the plan keeps cached (README, "Larger than memory", item 5). A child's memory goes when
    it exits. The child times the target as this load will run it (the same memory plan: its trees'
    sizes, its kept layers) where it can: it holds one model at a time, and while it times the target
    the drafter's room holds its own interpreter (planned again within what is left, it would give
    up tree size and time too few pass sizes for the planner's trees)."""
    facts, backends = machine_facts(home()), profile_backends(plan, drafters=drafters)
    found = load_profile(facts, backends)
    measured = child_plan(plan)
    timed = found.targets.get(plan.target_backend) if found is not None else None
    stale = timed is not None and measured is plan and not times_trees_of(timed, plan.memory.sizes.max_tree)
    if timed is not None and plan.drafter_backend in found.drafters and not stale:
        return found
    child = multiprocessing.get_context("spawn").Process(
        target=_measure_streaming, args=(measured, plan.memory.process_bytes, drafters, compare, stale, backends.key),
        name="ondevice-profile",
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


def _measure_streaming(plan: LoadPlan, process_bytes: int, drafters, compare: bool, refresh: bool, key: str) -> None:
    """In the child process of `streaming_profile`: measure and save the profile, with the parent's
    memory plan, or planned as the parent plans (the same process size) within what it leaves;
    `refresh`: measured anew (the saved profile's passes stop short of the plan's trees). Saved under
    the parent's `key`: a plan made within less room may keep the LM head where the parent's does not."""
    try:
        memory = plan.memory or MemoryPlans(plan.files, plan.options, process_bytes).plan(plan.target_backend, plan.drafter_backend, plan.n_ctx)
        get_profile(profile_backends(replace(plan, memory=memory), drafters=drafters, key=key), refresh=refresh, compare=compare)
    except Exception as err:  # noqa: BLE001 - one line; the parent measures in its own process instead
        print(f"ondevice: measuring the streaming profile apart failed ({err}); the main process measures it", file=sys.stderr)
        sys.exit(1)
