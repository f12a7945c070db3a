"""The drafter's RAM or the target's layers (loading/drafter_room.py): the comparison trusts what was
measured over what is predicted, and on a tiny pair whose target streams, the load leaves the
drafter out where the target alone measured faster — its answers still the target alone's — and
keeps it where speculation measured faster, or where asked."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

import ondevice
from ondevice.catalog.choose import choose
from ondevice.loading import choices, options, profiling
from ondevice.loading import plan as load_plan
from ondevice.machine import ram
from ondevice.cli.decoding import keeping_drafter
from ondevice.errors import OndeviceError
from ondevice.plan.acceptance import default_p_rank
from ondevice.plan.arms import ArmBook, Tally, book_path, load_book, save_book
from ondevice.plan.auto import regime_of
from ondevice.plan.cost_model import choose_plan
from ondevice.plan.curve import Curves, pass_sizes
from ondevice.loading.drafter_room import (
    MAX_TIMINGS, MEASURED_TOKENS, UNSURE, AlonePass, DrafterChoice, best_measured, choose_drafter, measured_slower,
)
from ondevice.plan.profile import Profile
from ondevice.plan.fallback import MAX_LOOKUP_BUDGET
from ondevice.decode.protocols import FREE_TREE_NODES, DraftSpec
from ondevice.decode.verify import Sampling

from test_backends import FAST_DRAFT, curve
from test_streaming_pipeline import MESSAGES, answer, least_budget_keeping_the_head, stream_tiny_target, tiny_home, write_deep_pair  # noqa: F401 - a fixture

DISK_BOUND = curve({1: 0.80, 2: 0.80, 4: 0.81, 8: 0.83, 16: 0.86, 32: 0.92, 64: 1.02})


class Saved:
    """What choose_drafter reads of a profile: its curves and the drafter-less pass."""

    def __init__(self, alone: AlonePass | None):
        self.curves = Curves(DISK_BOUND, FAST_DRAFT)
        self.alone = alone.to_dict() if alone is not None else None


def book(**arms: tuple[float, float]) -> ArmBook:
    """A book whose arms measured (tokens, seconds), saved just now."""
    return ArmBook(arms={name: Tally(tokens=t, seconds=s, rounds=t) for name, (t, s) in arms.items()}, saved_at=time.time())


ALONE = AlonePass(seconds=0.25, bytes_read_per_pass=200 << 20, kept_layers=20, in_ram=False)


def test_no_drafter_less_pass_timed_means_nothing_to_compare():
    assert choose_drafter(Saved(None), default_p_rank(), ArmBook(), ArmBook()) is None


def test_an_arm_is_trusted_once_measured_enough():
    assert best_measured(book(target=(MEASURED_TOKENS - 1, 1.0))) is None
    assert best_measured(book(target=(40, 10.0), **{"best-first@8": (60, 10.0)})) == pytest.approx(6.0)


def test_measured_speculation_slower_than_the_timed_target_alone_leaves_the_drafter_out():
    choice = choose_drafter(Saved(ALONE), default_p_rank(), book(**{"best-first@8": (60, 20.0)}), ArmBook(), layers_with=9)
    assert not choice.keep and choice.with_source == "measured" and choice.without_source == "timed"
    assert choice.with_drafter == pytest.approx(3.0) and choice.without == pytest.approx(4.0)
    assert "drafter left out" in choice.describe() and "9 layers" in choice.describe() and "20 layers" in choice.describe()


def test_measured_speculation_faster_keeps_the_drafter():
    choice = choose_drafter(Saved(ALONE), default_p_rank(), book(**{"best-first@8": (60, 6.0)}), ArmBook())
    assert choice.keep and choice.with_drafter == pytest.approx(10.0)


def test_what_the_drafter_less_regime_measured_beats_its_timed_pass():
    without = book(target=(30, 30.0), lookup=(40, 8.0))  # 1 and 5 tok/s measured, against 4 timed
    choice = choose_drafter(Saved(ALONE), default_p_rank(), book(**{"best-first@8": (60, 13.0)}), without)
    assert choice.without_source == "measured" and choice.without == pytest.approx(5.0) and not choice.keep


def test_a_rate_one_session_measured_stays_measured_at_the_next_load(tmp_path, monkeypatch):
    """A saved book is loaded at half weight: what a session measured MEASURED_TOKENS of must still
    count as measured, or the drafter it measured slower is predicted (faster) and loaded again."""
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    session = book(**{"best-first@8": (MEASURED_TOKENS + 4, (MEASURED_TOKENS + 4) / 3.0)})  # 3 tok/s, one answer's worth
    save_book(session, "pair", "with")
    loaded = load_book("pair", "with")
    assert loaded.arms["best-first@8"].tokens < MEASURED_TOKENS  # the load weight halved it
    fast = replace(ALONE, seconds=1 / 3.5)  # the target alone timed at 3.5 tok/s: a prediction beats it, a measurement not
    choice = choose_drafter(Saved(fast), default_p_rank(), loaded, ArmBook())
    assert choice.with_source == "measured" and choice.with_drafter == pytest.approx(3.0)
    assert not choice.keep and not choice.explore


def test_with_nothing_measured_the_cost_model_predicts_speculation():
    choice = choose_drafter(Saved(ALONE), default_p_rank(), ArmBook(), ArmBook())
    predicted = choose_plan(Curves(DISK_BOUND, FAST_DRAFT), default_p_rank(), overlap_possible=False).predicted_tokens_per_second
    assert choice.with_source == "predicted" and choice.with_drafter == pytest.approx(predicted)
    assert choice.keep == (predicted > 4.0)  # beats the timed pass: kept (by the planner's distrust), or kept to be measured
    for factor, keep, explore in ((0.8, False, False), (1.5, True, True), (2.5, True, False)):  # the pass timed at predicted / factor tok/s
        timed = choose_drafter(Saved(replace(ALONE, seconds=factor / predicted)), default_p_rank(), ArmBook(), ArmBook())
        assert (timed.keep, timed.explore) == (keep, explore) and timed.with_source == "predicted"
        assert not timed.unsure  # an explored drafter is measured, not the pass timed again
    measured = choose_drafter(Saved(replace(ALONE, seconds=1.5 / predicted)), default_p_rank(),
                              book(**{"best-first@8": (60, 180 / predicted)}), ArmBook())  # then measured at a third: slower than the pass
    assert measured.with_source == "measured" and not measured.keep and not measured.explore


def test_a_drafter_whose_plan_would_page_is_kept_only_on_what_it_measured():
    predicted = choose_plan(Curves(DISK_BOUND, FAST_DRAFT), default_p_rank(), overlap_possible=False).predicted_tokens_per_second
    for factor in (1.5, 2.5):  # predicted faster: to be measured, or kept outright, where the plan does not page
        saved = Saved(replace(ALONE, seconds=factor / predicted))
        assert choose_drafter(saved, default_p_rank(), ArmBook(), ArmBook()).keep
        paging = choose_drafter(saved, default_p_rank(), ArmBook(), ArmBook(), paging=True)
        assert not paging.keep and not paging.explore and "over budget" in paging.describe()
    measured = choose_drafter(Saved(ALONE), default_p_rank(), book(**{"best-first@8": (90, 10.0)}), ArmBook(), paging=True)
    assert measured.keep  # measured in its own regime at 9 tok/s against 4 timed: kept, paging or not


def test_a_close_call_is_timed_again_and_the_mean_of_the_last_timings_decides():
    again = ALONE.folded(replace(ALONE, seconds=0.15))
    assert again.seconds == pytest.approx(0.20) and again.timings == 2
    drifted = ALONE
    for _ in range(30):
        drifted = drifted.folded(replace(ALONE, seconds=0.10))
    assert drifted.timings == MAX_TIMINGS and drifted.seconds < 0.11  # the old timing fades
    close = choose_drafter(Saved(ALONE), default_p_rank(), book(**{"best-first@8": (60, 10.0)}), ArmBook())  # 6 against 4 timed
    assert close.keep and close.unsure
    clear = choose_drafter(Saved(ALONE), default_p_rank(), book(**{"best-first@8": (90, 10.0)}), ArmBook())  # 9 against 4
    assert clear.keep and not clear.unsure


def test_a_timing_of_another_drafter_less_plan_is_timed_afresh():
    timed = AlonePass(0.2, 250 << 20, 20, False)
    assert timed.times(20) and timed.times(21) and timed.times(19)  # a layer either way: one process's RSS to the next
    assert not timed.times(24) and not timed.times(16)  # buffers sized otherwise: another plan, another pass


def test_a_tree_that_needs_the_drafter_keeps_it_and_contradicts_drop_drafter():
    load = options.LoadOptions()
    assert keeping_drafter(load, [DraftSpec("auto", 0), None]).keep_drafter is None  # the load decides
    assert keeping_drafter(load, [DraftSpec("lookup", 8)]).keep_drafter is None  # free drafts need no model
    assert keeping_drafter(load, [DraftSpec("lookup", 20), DraftSpec("suffix", 4)]).free_tree_nodes == 21  # the largest, with its root
    assert keeping_drafter(load, [DraftSpec("auto", 0), None]).free_tree_nodes == FREE_TREE_NODES
    assert keeping_drafter(load, [DraftSpec("best-first", 8)]).keep_drafter is True
    assert keeping_drafter(load, [DraftSpec("auto", 8)]).keep_drafter is True  # auto held to --budget: the drafter's trees
    with pytest.raises(OndeviceError, match="--drop-drafter"):
        keeping_drafter(options.LoadOptions(keep_drafter=False), [DraftSpec("chain", 4)])


def test_a_regime_without_the_drafter_model_is_booked_apart():
    class Backends:
        profile_key, target_name, drafter_name = "cpu-t2-stream", "llama", "llama"
        make_decode_batch = staticmethod(lambda n: None)

    class Lean(Backends):
        make_decode_batch = None

    assert regime_of(Backends()) == "cpu-t2-stream-llama-llama" and regime_of(Lean()) == "cpu-t2-stream-llama-none"


def test_rates_measured_with_the_lm_head_kept_do_not_decide_for_a_plan_that_streams_it(tmp_path, monkeypatch):
    target, drafter = write_deep_pair(tmp_path, monkeypatch)
    kept = least_budget_keeping_the_head(target, drafter, 256)
    load = dict(target_backend="llama", drafter_backend="llama", threads=1, ctx=256)
    files, regime = choose("deep", None, None, True), {}
    for name, budget in (("kept", kept), ("paged", kept - 1)):
        monkeypatch.setattr(load_plan, "ram_budget", lambda budget=budget: ram.RamBudget(budget, "test"))
        regime[name] = regime_of(profiling.profile_backends(choices.plan_load(options.LoadOptions(model="deep", **load), files, 200 << 20)))
    assert regime == {"kept": "cpu-t1-stream-llama-llama", "paged": "cpu-t1-stream-paged-llama-llama"}
    save_book(book(**{"best-first@8": (10**7, 1.0)}), "deep", regime["kept"])  # measured with the head kept: it pays
    for budget, source in ((kept, "measured"), (kept - 1, "predicted")):  # another regime: nothing measured there yet
        monkeypatch.setattr(load_plan, "ram_budget", lambda budget=budget: ram.RamBudget(budget, "test"))
        with ondevice.load("deep", **load) as pipe:
            assert pipe.memory.streams and pipe.info["drafter_choice"]["with_source"] == source


def regimes(home) -> tuple[str, str]:
    """The planner's regimes of the tiny pair streamed with its drafter and without it."""
    opts = options.LoadOptions(model="tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=256)
    files = choose("tiny", None, None, True)
    plan = choices.plan_load(opts, files, 200 << 20)
    assert plan.lean is not None and plan.lean.files == replace(files, drafter=None)  # planned with it, not loaded again
    return regime_of(profiling.profile_backends(plan)), regime_of(profiling.profile_backends(plan.lean))


def test_a_streaming_target_loads_without_the_drafter_where_the_target_alone_measured_faster(tiny_home, monkeypatch):  # noqa: F811
    stream_tiny_target(tiny_home, monkeypatch)
    load = dict(target_backend="llama", drafter_backend="llama", threads=1, ctx=256)
    with ondevice.load("tiny", draft=False, **load) as alone:
        reference, _ = answer(alone, None)
    with_drafter, without = regimes(tiny_home)
    save_book(book(**{"best-first@8": (100, 1000.0)}), "tiny", with_drafter)  # speculation measured 0.1 tok/s here
    with ondevice.load("tiny", **load) as pipe:
        (saved,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
        alone_pass = AlonePass.from_dict(Profile.from_dict(json.loads(saved.read_text())).alone)
        assert alone_pass.seconds > 0 and alone_pass.bytes_read_per_pass == pipe.memory.bytes_read_per_pass  # the plan it runs
        assert alone_pass.kept_layers == pipe.memory.kept_layer_count
        assert pipe.engine.drafter.model is None and pipe.memory.drafter_bytes == 0
        assert pipe.info["drafter_choice"]["keep"] is False and "drafter left out" in pipe.placement
        assert pipe.auto_planner().regime == without
        sizes = pass_sizes(min(pipe.memory.sizes.max_tree, MAX_LOOKUP_BUDGET + 1))  # every pass a sized free round makes
        assert alone_pass.lean_curve().ns == sizes
        # its 1-token point and the timed pass are two timings of the same sub-millisecond pass: the same within a shared machine's noise
        assert alone_pass.seconds / 3 <= alone_pass.lean_curve()(1) <= alone_pass.seconds * 3
        assert pipe.auto_planner().lean_curve == alone_pass.lean_curve()  # what its free rounds are sized on
        assert pipe.auto_planner().spec(Sampling(), context=10).pass_seconds is not None
        lean, _ = answer(pipe, DraftSpec("auto", 0))  # free drafts stay on
        with pytest.raises(OndeviceError, match="--tree best-first to load it"):
            answer(pipe, DraftSpec("best-first", 4))
    assert lean == reference
    save_book(book(**{"best-first@8": (10**7, 1.0)}), "tiny", with_drafter)  # measured 10^7 tok/s: it pays
    assert load_book("tiny", with_drafter).arms["best-first@8"].tokens > 0 and book_path("tiny", with_drafter).exists()
    with ondevice.load("tiny", **load) as pipe:
        assert pipe.engine.drafter.model is not None and pipe.info["drafter_choice"]["keep"] is True
    (saved,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
    timed = AlonePass.from_dict(Profile.from_dict(json.loads(saved.read_text())).alone)
    assert timed.timings == 1  # kept by far: not timed again
    book_path("tiny", without).unlink(missing_ok=True)  # against the timed pass, not the free drafts' answers above
    close = 1.5 / timed.seconds  # kept, but by less than UNSURE: the next load times it again
    save_book(book(**{"best-first@8": (close * 100, 100.0)}), "tiny", with_drafter)
    with ondevice.load("tiny", **load):
        pass
    assert AlonePass.from_dict(Profile.from_dict(json.loads(saved.read_text())).alone).timings == 2
    with ondevice.load("tiny", keep_drafter=False, **load) as pipe:  # --drop-drafter
        assert pipe.engine.drafter.model is None
        assert pipe.memory.sizes.max_tree == 8  # buffers for the free drafters' trees (7 nodes), not the drafter's 64
    with ondevice.load("tiny", keep_drafter=False, free_tree_nodes=21, **load) as pipe:  # --tree recycle --budget 20
        assert pipe.memory.sizes.max_tree == 32
        assert answer(pipe, DraftSpec("recycle", 20))[0] == reference
    data = json.loads(saved.read_text())
    data["alone"].pop("curve")  # a pass timed before its curve was kept
    saved.write_text(json.dumps(data))
    with ondevice.load("tiny", keep_drafter=False, **load) as pipe:  # timed again, with the curve its planner sizes on
        assert pipe.auto_planner().lean_curve is not None and AlonePass.from_dict(json.loads(saved.read_text())["alone"]).curve


def scaled(c, factor: float):
    return type(c)(c.ns, tuple(s * factor for s in c.seconds))


def test_the_drafter_less_answers_are_planned_booked_and_weighed_at_the_next_load(tiny_home, monkeypatch):  # noqa: F811
    stream_tiny_target(tiny_home, monkeypatch)
    load = dict(target_backend="llama", drafter_backend="llama", threads=1, ctx=256)
    with_drafter, without = regimes(tiny_home)
    with ondevice.load("tiny", draft=False, **load) as alone:
        reference, _ = answer(alone, None)
    with ondevice.load("tiny", keep_drafter=False, **load) as pipe:  # --drop-drafter
        for _ in range(6):
            tokens, stats = answer(pipe, DraftSpec("auto", 0))
            assert tokens == reference  # the free drafters or the target alone, as the planner chose: the same answer
        assert pipe.planner.regime == without and not pipe.planner.has_drafter
        assert set(pipe.planner.book.arms) <= {"target", "lookup", "suffix", "recycle"}  # no drafter model: no tree of its
    saved = load_book("tiny", without)  # at half weight, as the next load reads it
    assert sum(arm.tokens for arm in saved.arms.values()) >= MEASURED_TOKENS and best_measured(saved) > 0  # faded, halved
    save_book(book(**{"best-first@8": (100, 1000.0)}), "tiny", with_drafter)  # speculation measured 0.1 tok/s
    with ondevice.load("tiny", **load) as pipe:
        choice = pipe.drafter_choice
        (profile,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
        speed = AlonePass.from_dict(Profile.from_dict(json.loads(profile.read_text())).alone).yardstick
        rescaled = load_book("tiny", without, speed)  # at the machine's speed as this load timed it (ArmBook.rescale)
        assert choice.without_source == "measured" and choice.without == pytest.approx(best_measured(rescaled))
        assert not choice.keep and pipe.engine.drafter.model is None
    save_book(book(**{"best-first@8": (10**7, 1.0)}), "tiny", with_drafter)
    with ondevice.load("tiny", **load) as pipe:  # a drafter kept: its answers go to the drafter's regime
        assert pipe.drafter_choice.keep
        answer(pipe, DraftSpec("auto", 0))
        assert pipe.planner.regime == with_drafter


def test_a_drafter_kept_on_a_prediction_is_left_out_once_measured_slower(tiny_home, monkeypatch):  # noqa: F811
    stream_tiny_target(tiny_home, monkeypatch)
    load = dict(target_backend="llama", drafter_backend="llama", threads=1, ctx=256)
    with ondevice.load("tiny", draft=False, **load) as alone:
        reference, _ = answer(alone, None)
    with ondevice.load("tiny", **load):
        pass  # the streaming profile (the drafter's curves, measured in a child) and the drafter-less pass
    (path,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
    saved = Profile.from_dict(json.loads(path.read_text()))
    fast = 1e-6  # predicted: ~10^5 tok/s with the drafter; the target alone "timed" at 10^4 tok/s, above what it can measure
    saved.targets = {"llama": scaled(DISK_BOUND, fast)}
    saved.drafters = {"llama": scaled(FAST_DRAFT, fast)}
    saved.curves = saved.curves_for("llama", "llama")
    saved.alone = {**saved.alone, "seconds": 1e-4}
    path.write_text(json.dumps(saved.to_dict()))
    with ondevice.load("tiny", **load) as pipe:
        assert pipe.drafter_choice.keep and pipe.drafter_choice.with_source == "predicted"
        assert pipe.engine.drafter.model is not None
        for _ in range(12):  # answers until the planner has measured an arm enough (its rounds may spread over several)
            answer(pipe, DraftSpec("auto", 0))
            if pipe.engine.drafter.model is None:
                break
        assert pipe.engine.drafter.model is None and pipe.memory.drafter_bytes == 0  # loaded again, without it
        assert not pipe.drafter_choice.keep and pipe.drafter_choice.with_source == "measured"
        assert "drafter left out" in pipe.placement
        lean, _ = answer(pipe, DraftSpec("auto", 0))
    assert lean == reference


def test_bench_runs_auto_on_a_pipeline_without_the_drafter_model(tiny_home, monkeypatch):  # noqa: F811
    from ondevice.cli.bench_cmd import bench_specs
    from ondevice.decode.verify import Sampling

    stream_tiny_target(tiny_home, monkeypatch)
    with ondevice.load("tiny", target_backend="llama", threads=1, ctx=256, keep_drafter=False) as pipe:  # --drop-drafter
        assert pipe.engine.drafter.model is None
        ids = [pipe.encode_chat(MESSAGES)]
        rows = [result for result, _ in bench_specs(pipe, ids, [None, DraftSpec("auto", 0)], 16, Sampling(), as_json=True)]
    assert [r.builder for r in rows] == ["none", "auto"] and rows[1].predicted_tokens_per_second > 0  # planned: priced
    assert rows[1].same_as_target == 1  # the free drafters' answer is the target alone's


def test_a_nearly_fitting_target_is_left_to_the_page_cache_where_that_timed_faster(tiny_home, monkeypatch):  # noqa: F811
    from ondevice.loading import drafter_room

    stream_tiny_target(tiny_home, monkeypatch)
    monkeypatch.setattr(drafter_room, "NEAR_FIT", 1.0)  # the tiny target's drafter-less plan counts as nearly fitting
    load = dict(target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=False)
    with ondevice.load("tiny", draft=False, **load) as alone:
        reference, _ = answer(alone, None)
    timed, planned = drafter_room.time_plan, []

    def faster(steered: bool):  # each plan really loaded and timed; the one named made 10x faster, so that it wins
        def time_plan(lean):
            planned.append(lean.memory.steered)
            t = timed(lean)
            return replace(t, seconds=t.seconds / 10) if lean.memory.steered == steered else t
        return time_plan

    monkeypatch.setattr(drafter_room, "time_plan", faster(steered=False))
    with ondevice.load("tiny", **load) as pipe:
        assert planned == [True, False]  # both timed
        assert pipe.memory.streams and not pipe.memory.steered and pipe.engine.target.window is None
        assert "left to the page cache" in pipe.placement
        assert answer(pipe, DraftSpec("auto", 0))[0] == reference
    (saved,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
    assert AlonePass.from_dict(json.loads(saved.read_text())["alone"]).steered is False
    with ondevice.load("tiny", **load) as pipe:  # the next load: as timed, not timed again
        assert planned == [True, False] and not pipe.memory.steered
    data = json.loads(saved.read_text())
    data["alone"].pop("steered")  # a pass timed before the kernel's way was timed: timed again
    saved.write_text(json.dumps(data))
    monkeypatch.setattr(drafter_room, "time_plan", faster(steered=True))
    with ondevice.load("tiny", **load) as pipe:
        assert planned[2:] == [True, False] and pipe.memory.steered and pipe.engine.target.window is not None
        assert answer(pipe, DraftSpec("auto", 0))[0] == reference


def test_a_target_that_does_not_nearly_fit_is_not_timed_left_to_the_kernel(tiny_home, monkeypatch):  # noqa: F811
    from ondevice.loading import drafter_room

    stream_tiny_target(tiny_home, monkeypatch)
    monkeypatch.setattr(drafter_room, "NEAR_FIT", -1.0)  # no plan nearly fits (the tiny one keeps every layer)
    timed, planned = drafter_room.time_plan, []
    monkeypatch.setattr(drafter_room, "time_plan", lambda lean: planned.append(lean.memory.steered) or timed(lean))
    with ondevice.load("tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=False) as pipe:
        assert planned == [True] and pipe.memory.steered


def test_a_timed_target_alone_must_beat_measured_speculation_by_the_planners_distrust_mid_session():
    timed = DrafterChoice(True, 5.0, 3.0, "predicted", "timed")
    assert not measured_slower(2.5, timed)  # one timed pass promising 1.2x what the answers measured: kept
    assert measured_slower(1.4, timed)  # below half the timed rate
    measured = replace(timed, without_source="measured")
    assert measured_slower(2.5, measured) and not measured_slower(3.1, measured)  # measured against measured: plainly


def test_a_drafterless_plan_is_timed_with_its_buffers_in_use(tiny_home, monkeypatch):  # noqa: F811
    """The drafter-less passes are timed after one prompt-sized pass: llama.cpp's compute buffers are then
    the process's pages, as in a conversation, not room the page cache has only while it is timed."""
    from ondevice.loading import drafter_room
    from ondevice.plan.latency import ALONE_CONTEXT
    from ondevice.targets.llama_target import LlamaTarget

    stream_tiny_target(tiny_home, monkeypatch)
    timed, prefills = drafter_room.time_plan, []

    def time_plan(lean):
        prefills.append([])
        return timed(lean)

    original = LlamaTarget.prefill

    def prefill(self, tokens):
        if prefills:
            prefills[-1].append(len(tokens))
        return original(self, tokens)

    monkeypatch.setattr(LlamaTarget, "prefill", prefill)
    monkeypatch.setattr(drafter_room, "time_plan", time_plan)
    with ondevice.load("tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=False) as pipe:
        assert pipe.memory.streams and prefills
    ubatch = pipe.memory.sizes.target_ubatch
    for sizes in prefills:  # each timing: the buffers' pass first, then the timed context
        assert sizes[0] == min(ubatch, 256 // 2) > ALONE_CONTEXT and ALONE_CONTEXT in sizes[1:]
