"""Planning a load whose target is split across workers (`--rpc`): this machine's memory plan for
its own share, and the split (split.py) of the rest, asked of the workers before anything loads."""

from __future__ import annotations

from dataclasses import replace

from ondevice.machine.ram import RamBudget, ram_budget
from ondevice.loading.footprint import ModelSize
from ondevice.loading.memory import MemoryPlan, plan_memory
from ondevice.rpc import library
from ondevice.loading.rpc_split import RpcSplit, connect_workers, local_room, plan_split
from ondevice.sizes import parse_size

RPC_MAX_TREE = 64  # the largest tree verified over RPC: each node's logits (n_vocab × 4 bytes, 0.6 MB for
# Qwen2.5) cross the network from the last worker, so larger trees pay a slope the profile measures anyway
RPC_UBATCH = 256  # prompt tokens per pass: each worker's compute scratch holds one ubatch's attention scores
UNBOUNDED = RamBudget(1 << 62, "unbounded")

__all__ = ["RpcSplit", "plan_split_load"]


def plan_split_load(target: ModelSize, drafter: ModelSize | None, opts, process_bytes: int | None = None) -> tuple[MemoryPlan, RpcSplit]:
    """(this machine's memory plan, the split): the buffers sized as for a target in RAM with trees of
    up to RPC_MAX_TREE nodes; what the budget leaves after them and the drafter is this machine's
    room for layers, each worker's is what it offers."""
    budget = ram_budget()
    if opts.ram_memory is not None and parse_size(opts.ram_memory) < budget.bytes:
        budget = RamBudget(parse_size(opts.ram_memory), "--ram-memory")
    sized = plan_memory(target, drafter, n_ctx=opts.context, max_tree=RPC_MAX_TREE, budget=UNBOUNDED, process_bytes=process_bytes)
    sizes = replace(sized.sizes, target_ubatch=min(RPC_UBATCH, sized.sizes.target_ubatch))
    resident = sized.resident_bytes - sized.buffers["target KV cache"]  # each layer's KV cache lives with it (split.py)
    workers = connect_workers(library.parse_workers(opts.rpc))
    split = plan_split(target, local_room(budget.bytes, resident), workers, opts.context, sizes.target_ubatch, sizes.max_tree)
    return replace(sized, budget=budget, sizes=sizes, notes=[split.describe()]), split


def profile_split(backends, status=None) -> None:
    """Time the split's passes (and the drafter's) once, before its first answer, as a streaming
    target's are: the planner prices trees on this curve, a cost per pass (the round trips to the
    workers) and a slope per token (their compute, the logits sent back), rescaled by every pass
    it then sees. Saved under the split's own profile key (loading.profile_backends)."""
    from ondevice.machine.facts import machine_facts
    from ondevice.paths import home
    from ondevice.plan.profile import get_profile, load_profile

    if load_profile(machine_facts(home()), backends) is not None:
        return
    if status is not None:
        status("timing passes over the workers (once for this split)")
    get_profile(backends, show=status is None)
