"""Trees or layers (loading/tree_room.py): a streaming target's buffers are sized for the tree size the
cost model predicts fastest once its passes are timed — smaller trees where a pass over more nodes
computes longer than it reads, the largest where the disk is the bound — and the load runs that plan,
its answers still the target alone's."""

from __future__ import annotations

import json

import ondevice
from ondevice.catalog.choose import choose
from ondevice.cli.bench_cmd import save_report
from ondevice.loading import choices, options, profiling
from ondevice.loading import plan as load_plan
from ondevice.machine import ram
from ondevice.loading.memory import OUTPUT_LAYER
from ondevice.loading.tree_room import TreeRoom, fastest_room, price_tree_sizes, shifted_curve, trees_or_layers
from ondevice.plan.acceptance import default_p_rank
from ondevice.plan.cost_model import choose_plan
from ondevice.plan.curve import Curves
from ondevice.plan.profile import Profile
from ondevice.decode.protocols import DraftSpec

from test_backends import FAST_DRAFT, curve
from test_streaming_pipeline import answer, least_budget_keeping_the_head, write_deep_pair

MB = 1 << 20
FLAT = curve({1: 0.70, 2: 0.70, 4: 0.70, 8: 0.71, 16: 0.72, 32: 0.73, 64: 0.75})  # the disk is the bound throughout
STEEP = curve({1: 0.60, 2: 0.60, 4: 0.61, 8: 0.62, 16: 0.66, 17: 0.80, 32: 1.10, 64: 2.00})  # past 16 nodes the compute is


def test_a_plan_reading_less_shifts_every_pass_by_its_bytes_at_the_one_token_rate():
    shifted = shifted_curve(STEEP, 700 * MB, 600 * MB, 16)
    assert shifted.max_n == 16
    for n, s in zip(shifted.ns, shifted.seconds):
        assert abs(s - (STEEP(n) - 100 / 700 * 0.60)) < 1e-9


def test_a_flat_streamed_curve_keeps_the_largest_trees():
    plans = {64: (760 * MB, 0), 32: (740 * MB, 1), 16: (730 * MB, 1), 8: (725 * MB, 1)}  # buffers cost little here
    best = fastest_room(price_tree_sizes(Curves(FLAT, FAST_DRAFT), 760 * MB, plans, default_p_rank(), False))
    assert best.max_tree >= 32


def test_where_big_passes_compute_longer_than_they_read_the_room_keeps_layers():
    plans = {32: (710 * MB, 3), 16: (620 * MB, 5), 8: (590 * MB, 6)}
    rooms = price_tree_sizes(Curves(STEEP, FAST_DRAFT), 710 * MB, plans, default_p_rank(), False)
    assert [room.max_tree for room in rooms] == [32, 16, 8]
    assert fastest_room(rooms).max_tree in (16, 8)
    # each size priced as the cost model prices the planner's trees on that size's own passes
    for room in rooms:
        shifted = shifted_curve(STEEP, 710 * MB, plans[room.max_tree][0], room.max_tree)
        expected = choose_plan(Curves(shifted, FAST_DRAFT), default_p_rank(), False).predicted_tokens_per_second
        assert abs(room.predicted_tokens_per_second - expected) < 1e-9


def test_the_size_predicted_fastest_is_taken_and_of_sizes_as_fast_the_largest():
    rooms = [TreeRoom(32, 0, 0, 9.7, "a"), TreeRoom(16, 0, 0, 10.0, "b"), TreeRoom(8, 0, 0, 10.1, "c")]
    assert fastest_room(rooms).max_tree == 8
    rooms[1] = TreeRoom(16, 0, 0, 10.1, "b")
    assert fastest_room(rooms).max_tree == 16 and fastest_room([]) is None


LOAD = dict(target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=True)


def stream_deep_target(home, monkeypatch) -> None:
    """The 8-layer tiny pair under a budget where it streams keeping its LM head and a layer with
    trees up to 64 nodes, and more layers with smaller trees."""
    target, drafter = write_deep_pair(home, monkeypatch)
    budget = least_budget_keeping_the_head(target, drafter, 256) + MB
    monkeypatch.setattr(load_plan, "ram_budget", lambda: ram.RamBudget(budget, "test"))


def timed_plan(home, monkeypatch):
    """The deep pair's streaming plan, with its profile timed under it (as for the default pair: the
    parent's own plan)."""
    stream_deep_target(home, monkeypatch)
    plan = choices.plan_load(options.LoadOptions(model="deep", **LOAD), choose("deep", None, None, True), 200 << 20)
    monkeypatch.setattr(profiling, "child_plan", lambda plan: plan)
    return plan, profiling.streaming_profile(plan)


def test_a_streaming_profile_records_what_its_passes_read(tmp_path, monkeypatch):
    plan, profile = timed_plan(tmp_path, monkeypatch)
    assert plan.streams and profile.streamed_bytes == plan.memory.bytes_read_per_pass > 0
    (path,) = (tmp_path / "profiles").glob("*-deep-cpu-t1-stream*.json")
    assert Profile.from_dict(json.loads(path.read_text())).streamed_bytes == profile.streamed_bytes


def test_the_load_sizes_its_buffers_for_the_size_priced_fastest(tmp_path, monkeypatch):
    plan, profile = timed_plan(tmp_path, monkeypatch)
    assert plan.memory.sizes.max_tree == 64 and OUTPUT_LAYER in plan.memory.kept_layers(plan.memory.ahead)
    timed = plan.memory.bytes_read_per_pass
    profile.curves = Curves(STEEP, FAST_DRAFT)
    sized, rooms = trees_or_layers(plan, profile, default_p_rank())
    assert [room.max_tree for room in rooms] == [64, 32, 16, 8]
    assert sized.memory.sizes.max_tree == fastest_room(rooms).max_tree < 64
    assert sized.memory.budget == plan.memory.budget and sized.lean == plan.lean
    assert sized.memory.decode_slack == plan.memory.decode_slack  # what decoding adds does not shrink with the buffers
    assert sized.memory.kept_layer_count >= plan.memory.kept_layer_count and sized.memory.bytes_read_per_pass <= timed
    profile.streamed_bytes = 0  # a profile saved before it recorded its reads: nothing to weigh
    assert trees_or_layers(plan, profile, default_p_rank()) == (plan, [])


def test_a_streaming_load_reports_the_sizes_it_weighed_and_answers_as_the_target_alone(tmp_path, monkeypatch):
    stream_deep_target(tmp_path, monkeypatch)
    with ondevice.load("deep", draft=False, **LOAD) as alone:
        reference, _ = answer(alone, None)
    with ondevice.load("deep", **LOAD) as pipe:
        weighed = pipe.info["tree_sizes"]
        assert weighed and pipe.memory.sizes.max_tree in [room["max_tree"] for room in weighed]
        assert f"trees up to {pipe.memory.sizes.max_tree} nodes" in pipe.placement
        tokens, stats = answer(pipe, DraftSpec("best-first", min(8, pipe.memory.sizes.max_tree - 1)))
        assert pipe.stats_json(stats)["tree_sizes"] == weighed
        assert save_report(None, pipe, [], 24, 1, "tiny")["tree_sizes"] == weighed  # bench --json
    assert tokens == reference
