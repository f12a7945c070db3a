"""The pipeline as the CLI uses it, on a tiny catalog pair (real llama.cpp models, temp ONDEVICE_HOME):
the planner learns only from the answers it planned and its best-first plans keep the depth they
were priced at; `ondevice profile` shows the plan a chat starts with."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from rich.console import Console

import ondevice
from ondevice.plan import auto as autoplan
from ondevice.plan.cost_model import choose_plan, plan_as_dict
from ondevice.plan.fallback import LookupTracker
from ondevice.plan.hardware import Curves, LatencyCurve, powers_of_two
from ondevice.protocols import DraftSpec
from tiny_models import write_tiny_pair

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


def curve(points: dict[int, float]) -> LatencyCurve:
    return LatencyCurve(tuple(points), tuple(points.values()))


# An offloaded-looking target (a pass costs the same at any size) and a drafter whose call costs half a
# pass at any batch: big trees pay, but only a few levels of them (the plan caps the depth).
FLAT_TARGET = curve({n: 1.0 for n in powers_of_two(256)})
PER_LEVEL_DRAFTER = curve({n: 0.5 for n in powers_of_two(64)})


@pytest.fixture
def tiny_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    return tmp_path


def fake_profile(backends, curves: Curves):
    from ondevice.plan.hardware import Bandwidths, machine_facts
    from ondevice.plan.profile import Profile

    return Profile(backends.pair, backends.backend, machine_facts(), Bandwidths(1.0, None, None, 1.0), curves, [])


def test_planner_learns_only_from_the_answers_it_planned(tiny_home, monkeypatch):
    monkeypatch.setattr(autoplan, "get_profile", lambda backends, refresh=False, show=True: (fake_profile(backends, Curves(FLAT_TARGET, PER_LEVEL_DRAFTER)), True))
    seen = []  # (plan depth, tree depth) of every tree the planner observed
    observe = autoplan.AutoPlanner.observe
    monkeypatch.setattr(autoplan.AutoPlanner, "observe", lambda self, tree, path: (seen.append((self.plan.depth, tree.depths.max())), observe(self, tree, path)))
    pipe = ondevice.load("tiny", target_backend="llama", threads=1, n_ctx=512)

    list(pipe.stream(MESSAGES, max_tokens=24, spec=DraftSpec("auto", 0)))
    plan = pipe.plan
    assert plan is not None and plan.builder == "best-first" and plan.depth < plan.budget  # a depth-capped tree
    assert seen and all(tree_depth <= plan_depth for plan_depth, tree_depth in seen)  # drafted as priced
    unbounded = pipe.engine.drafter.draft(pipe.encode_chat(MESSAGES), DraftSpec("best-first", plan.budget))
    assert unbounded.depths.max() > plan.depth  # the cap mattered
    learned = pipe.planner.tracker.to_dict()

    for fixed in (DraftSpec("chain", 4), DraftSpec("lookup", 4)):  # `/set tree chain`, bench's fixed rows
        before = len(seen)
        list(pipe.stream(MESSAGES, max_tokens=24, spec=fixed))
        assert len(seen) == before and pipe.plan is None
        assert pipe.planner.tracker.to_dict() == learned

    list(pipe.stream(MESSAGES, max_tokens=24, spec=DraftSpec("auto", 0)))
    assert len(seen) > before and pipe.plan is not None


def test_profile_shows_the_plan_a_chat_starts_with(tiny_home, monkeypatch):
    """Where model drafting does not pay but prompt lookup has proven itself, chat decodes with lookup:
    `ondevice profile` must say so too (not the bare cost model's "target alone")."""
    from ondevice.cli.profile_cmd import show_profile
    from ondevice.pipeline import LoadOptions, load_backends

    steep = Curves(curve({1: 0.087, 2: 0.129, 4: 0.180, 8: 0.264, 16: 0.275}), curve({1: 0.120, 64: 0.900}))
    monkeypatch.setattr(autoplan, "get_profile", lambda backends, refresh=False, show=True: (fake_profile(backends, steep), True))
    copying = LookupTracker(decay=1.0)
    for _ in range(300):  # every round matched, 6 levels at risk, all accepted
        copying.observe_round(True, 6, 6)
    copying.save("tiny")

    backends = load_backends(LoadOptions(pair="tiny", target_backend="llama", threads=1, n_ctx=512))
    text = io.StringIO()
    show_profile(backends, as_json=True, out=Console(file=text))
    shown = json.loads(text.getvalue())["plan"]
    chat_plan = autoplan.AutoPlanner(backends, show=False).choose()
    assert shown == plan_as_dict(chat_plan) and shown["builder"] == "lookup"
    bare = choose_plan(steep, autoplan.AcceptanceTracker.load("tiny").p_rank, False)
    assert bare.builder == "target-only"  # what profile showed before it asked the planner
