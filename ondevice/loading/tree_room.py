"""Trees or layers: how large a tree a streaming target's buffers are sized for, once its passes are timed.

Where the target streams from disk, each node a tree may hold takes logits and compute buffers
(n_vocab × 4 bytes a node, twice, and the drafter's rows) out of the room that keeps the target's
layers cached, so larger trees mean more read every pass, whatever tree a round then drafts. The
memory plan takes the largest size that keeps the LM head (loading/memory.py), from sizes alone.
Once the streaming profile has timed the passes (loading/profiling.streaming_profile),
`trees_or_layers` weighs each size up to it with the cost model the planner decides by
(plan/cost_model.choose_plan):

    pass(n) for trees up to t  =  the timed pass of n tokens  +  (bytes(t) − bytes timed) × pass(1) ÷ bytes timed

(what the plan for t reads more or less than the plan the profile was timed under, at the rate the
1-token pass read), its points up to t nodes, with the drafter's timed calls and the pair's
acceptance; the size with the fastest predicted tok/s is loaded. Where a pass over more nodes
computes longer than its layers take to read, or the trees they allow add few tokens, the room is
worth more as kept layers; where the disk is the bound and buffers cost little, the larger trees
win. Measured: docs/measurements/2026-12-07-trees-or-layers.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ondevice.loading.memory import TREE_SIZES
from ondevice.loading.plan import LoadPlan
from ondevice.plan.cost_model import choose_plan
from ondevice.plan.curve import Curves, LatencyCurve, upto


@dataclass(frozen=True)
class TreeRoom:
    """One tree size as priced: its plan's reads and kept layers, and the cost model's best plan on it."""

    max_tree: int  # nodes the buffers hold
    bytes_read_per_pass: int
    kept_layers: int
    predicted_tokens_per_second: float
    tree: str  # the cost model's best plan within it ("best-first @15")

    def describe(self) -> str:
        return (f"trees up to {self.max_tree} nodes: {self.kept_layers} layers kept, {self.bytes_read_per_pass / 1e6:.0f} MB read a pass, "
                f"{self.tree} predicted {self.predicted_tokens_per_second:.2f} tok/s")

    def to_dict(self) -> dict:
        return asdict(self)


def shifted_curve(timed: LatencyCurve, timed_bytes: int, bytes_read: int, max_tree: int) -> LatencyCurve:
    """The timed passes up to `max_tree` tokens, each shifted by what a plan reading `bytes_read` a
    pass reads more (or less) than the `timed_bytes` it was timed under, at the 1-token pass's rate."""
    shift = (bytes_read - timed_bytes) * timed(1) / timed_bytes
    kept = upto(timed, max_tree)
    return LatencyCurve(kept.ns, tuple(max(1e-6, s + shift) for s in kept.seconds))


def price_tree_sizes(curves: Curves, timed_bytes: int, plans: dict[int, tuple[int, int]], p_rank,
                     overlap_possible: bool) -> list[TreeRoom]:
    """Each tree size's predicted rate (module docstring), largest size first. `plans`: max_tree ->
    (bytes read a pass, kept layers) of the plan with buffers for it."""
    rooms = []
    for max_tree, (bytes_read, kept) in sorted(plans.items(), reverse=True):
        target = shifted_curve(curves.target, timed_bytes, bytes_read, max_tree)
        best = choose_plan(Curves(target, curves.drafter), p_rank, overlap_possible)
        tree = "target alone" if best.builder == "target-only" else f"{best.builder} @{best.budget}"
        rooms.append(TreeRoom(max_tree, bytes_read, kept, best.predicted_tokens_per_second, tree))
    return rooms


def fastest_room(rooms: list[TreeRoom]) -> TreeRoom | None:
    """The size predicted fastest; of sizes predicted as fast, the largest (the planner can run smaller
    trees in larger buffers, not the reverse)."""
    return max(rooms, key=lambda room: (room.predicted_tokens_per_second, room.max_tree), default=None)


def trees_or_layers(plan: LoadPlan, profile, p_rank) -> tuple[LoadPlan, list[TreeRoom]]:
    """`plan` with a streaming target's buffers sized for the tree size predicted fastest (module
    docstring), and the sizes as priced; `plan` itself where nothing is to weigh: the target in RAM,
    no profile, a profile timed before it recorded what its passes read, or no other size that streams
    keeping the LM head as `plan` does."""
    memory = plan.memory
    if memory is None or not memory.streams or profile is None or profile.curves is None or profile.streamed_bytes <= 0:
        return plan, []
    timed = profile.curves.target
    sized = {memory.sizes.max_tree: plan}
    for size in TREE_SIZES:
        if size < memory.sizes.max_tree and size <= timed.max_n:
            smaller = plan.with_trees_up_to(size)
            if smaller.memory.streams and smaller.memory.head_in_ram == memory.head_in_ram and not smaller.memory.over_budget:
                sized[size] = smaller
    if len(sized) == 1:
        return plan, []
    plans = {size: (p.memory.bytes_read_per_pass, p.memory.kept_layer_count) for size, p in sized.items()}
    rooms = price_tree_sizes(profile.curves, profile.streamed_bytes, plans, p_rank, profile.overlap_possible)
    best = fastest_room(rooms)
    return sized[best.max_tree], rooms
