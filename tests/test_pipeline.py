"""The pipeline as the CLI uses it, on a tiny catalog pair (real llama.cpp models, temp ONDEVICE_HOME):
the planner learns only from the answers it planned and drafts within its budgets; `ondevice profile`
shows the plan a chat starts with; `close()` frees everything."""

from __future__ import annotations

import io
import json
import threading
from collections import Counter

import pytest
from rich.console import Console

import ondevice
from ondevice.plan import auto as autoplan
from ondevice.plan.cost_model import choose_plan, plan_as_dict
from ondevice.plan.fallback import LookupTracker
from ondevice.plan.curve import Curves, LatencyCurve, powers_of_two
from ondevice.decode.protocols import DraftSpec
import tiny_models
from tiny_models import write_tiny_pair

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


def curve(points: dict[int, float]) -> LatencyCurve:
    return LatencyCurve(tuple(points), tuple(points.values()))


# An offloaded-looking target (a pass costs the same at any size) and a drafter whose call costs half a
# pass at any batch: big trees pay.
FLAT_TARGET = curve({n: 1.0 for n in powers_of_two(256)})
PER_LEVEL_DRAFTER = curve({n: 0.5 for n in powers_of_two(64)})


@pytest.fixture
def tiny_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    return tmp_path


def fake_profile(backends, curves: Curves):
    from ondevice.machine.facts import Bandwidths, machine_facts
    from ondevice.plan.profile import Profile

    return Profile(backends.pair, backends.backend, machine_facts(), Bandwidths(1.0, None, None, 1.0), curves, [])


def test_planner_learns_only_from_the_answers_it_planned(tiny_home, monkeypatch):
    monkeypatch.setattr(autoplan, "saved_profile", lambda backends: fake_profile(backends, Curves(FLAT_TARGET, PER_LEVEL_DRAFTER)))
    seen = []  # (plan budget, tree nodes drafted) of every tree the planner observed
    # the tiny model's real rounds take far less than the fake profile's 1 s, which would (rightly)
    # re-plan: this test is about what is learned, so only acceptance is passed on
    monkeypatch.setattr(autoplan.AutoPlanner, "observe", lambda self, report: (seen.append((self.plans[self.playing].budget, len(report.tree) - 1)),
                                                                              self.tracker.observe(report.tree, report.path)))
    pipe = ondevice.load("tiny", target_backend="llama", threads=1, ctx=512)

    list(pipe.stream(MESSAGES, max_tokens=24, spec=DraftSpec("auto", 0)))
    plan = pipe.plan
    assert plan is not None and plan.builder == "best-first"  # big trees pay on a flat target
    assert seen and all(0 < drafted <= budget for budget, drafted in seen)  # drafted as planned, never past the budget
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
    from ondevice.loading.choices import load_backends
    from ondevice.loading.options import LoadOptions

    steep = Curves(curve({1: 0.087, 2: 0.129, 4: 0.180, 8: 0.264, 16: 0.275}), curve({1: 0.120, 64: 0.900}))
    monkeypatch.setattr(autoplan, "get_profile", lambda backends, **options: (fake_profile(backends, steep), True))
    monkeypatch.setattr(autoplan, "saved_profile", lambda backends: fake_profile(backends, steep))
    copying = LookupTracker(decay=1.0)
    for _ in range(300):  # every round matched, 6 levels at risk, all accepted
        copying.observe_round(True, 6, 6)
    copying.save("tiny")

    backends = load_backends(LoadOptions(model="tiny", target_backend="llama", threads=1, ctx=512))
    text = io.StringIO()
    show_profile(backends, as_json=True, out=Console(file=text))
    shown = json.loads(text.getvalue())["plan"]
    chat_plan = autoplan.AutoPlanner(backends, show=False).choose()
    assert shown == plan_as_dict(chat_plan) and shown["builder"] == "lookup"
    bare = choose_plan(steep, autoplan.AcceptanceTracker.load("tiny").p_rank, False)
    assert bare.builder == "target-only"  # what profile showed before it asked the planner


def test_a_stopped_answer_leaves_the_cache_holding_what_was_shown(tiny_home):
    """Stopping an answer (Ctrl-C in chat: should_stop) leaves the target's cache holding the prompt
    and the shown tokens (all but the last, which becomes the next pass's root): nothing unseen."""
    with ondevice.load("tiny", target_backend="llama", threads=1, ctx=512) as pipe:
        ids, shown = pipe.encode_chat(MESSAGES), []
        records = pipe.stream_tokens(ids, max_tokens=200, spec=DraftSpec("chain", 3), should_stop=lambda: len(shown) >= 6)
        for record in records:
            shown += record.token_ids
        assert record.stats.finish_reason == "interrupted" and 6 <= len(shown) < 200
        assert pipe.engine.cached == ids + shown[:-1]
        assert pipe.engine.target.n_cached == len(pipe.engine.cached)


# --- closing ---------------------------------------------------------------------------------------


def ondevice_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("ondevice"))


def left_running(before: list[str]) -> list[str]:
    """ondevice threads running now that were not before (another test's may have ended meanwhile)."""
    return sorted((Counter(ondevice_threads()) - Counter(before)).elements())


def test_close_frees_models_and_threads_and_the_pair_loads_again(tmp_path, monkeypatch):
    """An offloaded torch target (layers streamed from RAM and disk: copy and disk threads) with the
    overlap worker: every thread ends and every llama.cpp model is freed when the block ends."""
    import torch

    from ondevice.errors import OndeviceError
    from ondevice.targets.offloaded import plan_offload

    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setitem(tiny_models.DIMS, "num_hidden_layers", 6)  # enough layers that most can stream
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    plan = plan_offload(tmp_path / "models" / "tiny-target.gguf", "cpu", torch.float32, 256, "1TB", "1TB", max_tree=256)
    layer = max(layout.nbytes for layout in plan.layouts.values())
    floor = plan.resident_bytes + 3 * layer  # two ring slots and one decoded layer: nothing stays resident
    options = dict(target_backend="torch", device="cpu", gpu_memory=str(floor), ram_memory=str(3 * layer),
                   threads=1, ctx=256, overlap=True)  # RAM: two disk staging buffers and one layer

    def answer(pipe) -> list[int]:
        return [t for r in pipe.stream(MESSAGES, max_tokens=16, spec=DraftSpec("chain", 3)) for t in r.token_ids]

    before = ondevice_threads()  # other tests' engines may still hold theirs
    with ondevice.load("tiny", **options) as pipe:
        first = answer(pipe)
        assert pipe.engine.target.placement.from_disk and pipe.engine.target.placement.from_ram
        started = ondevice_threads()
        for name in ("ondevice-copy", "ondevice-disk", "ondevice-target_0"):
            assert started.count(name) == before.count(name) + 1
        drafter = pipe.engine.drafter.model
    assert left_running(before) == []
    assert drafter.model.handle is None and pipe.tokenizer._model is None and pipe.engine.target.streamer is None
    with pytest.raises(OndeviceError, match="closed"):
        answer(pipe)
    pipe.close()  # twice is fine

    with ondevice.load("tiny", **options) as again:
        assert answer(again) == first
    assert left_running(before) == []


def test_the_tokenizer_reads_the_llama_targets_vocabulary_and_close_frees_both(tiny_home):
    """A llama.cpp target's vocabulary is held once: the pipeline's tokenizer reads the target's model
    (the memory plan counts one copy); the answer is the same as with a vocab-only tokenizer of the
    file, and closing the pipeline frees the model."""
    from ondevice.prompt.tokenizer import Tokenizer

    with ondevice.load("tiny", target_backend="llama", ctx=256, threads=1) as pipe:
        target = pipe.engine.target.model
        assert pipe.tokenizer.reads_from is target
        own = Tokenizer(target.path)
        ids = pipe.encode_chat(MESSAGES)
        assert ids == own.encode_chat(MESSAGES)
        answer = [t for r in pipe.stream(MESSAGES, max_tokens=12, spec=DraftSpec("chain", 3)) for t in r.token_ids]
        assert own.decode(answer) == pipe.tokenizer.decode(answer)
        own.close()
    assert target.handle is None and pipe.tokenizer.reads_from is None
