"""A pipeline whose target does not fit the RAM it may use, end to end on a tiny pair: the memory
plan streams the target (mapped, unrepacked, page cache steered), keeps the drafter resident and
sizes the buffers; the answers equal those of the same pair in RAM, and `stats_json` reports the
placement, the footprint and the bytes read per pass."""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest

import ondevice
from ondevice.catalog.choose import choose
from ondevice.loading import choices, options, pair, profiling
from ondevice.loading import plan as load_plan
from ondevice.machine import ram
from ondevice.loading import memory
from ondevice.plan import profile as profile_store
from ondevice.draft import recycle
from ondevice.draft.onnx_drafter import OnnxDrafter
from ondevice.machine.facts import measure_ram_bandwidth
from ondevice.onnx.export_files import export_dir
from ondevice.vocabtrim.build import find_trimmed
from ondevice.loading.footprint import ModelSize
from ondevice.loading.memory import MARGIN
from ondevice.plan.profile import Profile, save_profile
from ondevice.decode.protocols import DraftSpec
from ondevice.vocabtrim import build, shipped
from ondevice.decode.verify import Sampling
import tiny_models
from tiny_models import write_tiny_pair

from test_backends import FAST_DRAFT, SLOW_DRAFT, curve
from test_pipeline import left_running, ondevice_threads

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture
def tiny_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    return tmp_path


def stream_tiny_target(home, monkeypatch, name: str = "tiny", extra: int = 0) -> None:
    """A RAM budget that holds everything but the tiny target's weights (and `extra` bytes): it must
    stream. The process counts as 200 MB throughout (its real size moves as models are measured and freed)."""
    monkeypatch.setattr(memory, "anon_rss", lambda: 200 << 20)
    monkeypatch.setattr(pair, "anon_rss", lambda: 200 << 20)
    models = home / "models"
    target, drafter = ModelSize.from_gguf(models / f"{name}-target.gguf"), ModelSize.from_gguf(models / f"{name}-drafter.gguf")
    sizes = memory.context_sizes(256, max(memory.TREE_SIZES), streams=True)  # streaming with the largest trees
    resident = (200 << 20) + drafter.file_bytes + sum(memory._buffers(target, drafter, 256, sizes, memory.F16).values())
    budget = resident + target.streamed_window + MARGIN + extra  # room to stream, not to keep the weights
    if not extra:  # nor the head at a smaller tree, whose buffers leave more room, beside either drafter file
        trimmed = find_trimmed(models / f"{name}-drafter.gguf")
        drafters = [drafter] + ([ModelSize.from_gguf(trimmed)] if trimmed else [])
        budget = min([budget] + [least_budget_keeping_the_head(target, d, 256) - 1 for d in drafters])
    monkeypatch.setattr(load_plan, "ram_budget", lambda: ram.RamBudget(budget, "test"))


def answer(pipe, spec):
    records = list(pipe.stream(MESSAGES, max_tokens=24, spec=spec))
    return [t for r in records for t in r.token_ids], records[-1].stats


def test_a_target_that_does_not_fit_streams_and_answers_the_same(tiny_home, monkeypatch):
    spec = DraftSpec("best-first", 8)
    with ondevice.load("tiny", target_backend="llama", threads=1, ctx=256) as pipe:
        assert pipe.memory.target_in_ram and pipe.engine.target.window is None
        assert pipe.tokenizer.reads_from is pipe.engine.target.model  # in RAM: one vocabulary, the target's
        in_ram, _ = answer(pipe, spec)
    stream_tiny_target(tiny_home, monkeypatch)
    monkeypatch.setattr(pair, "streams_surely", lambda *args: True)  # as a target larger than the budget (its own test below)
    with ondevice.load("tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=True) as pipe:
        assert pipe.memory.streams and pipe.memory.sizes.max_tree <= max(memory.TREE_SIZES)
        assert pipe.engine.target.window is not None and pipe.engine.drafter.model.model.resident
        assert pipe.tokenizer.lets_go and not pipe.engine.target.model.has_vocab  # streaming: no vocabulary held
        assert not pipe.engine.drafter.model.model.has_vocab
        assert "streams from disk" in pipe.placement
        streamed, stats = answer(pipe, spec)
        report = pipe.stats_json(stats)
    assert streamed == in_ram
    assert report["placement"]["placement"] == "disk" and report["bytes_streamed_per_pass"] > 0
    assert report["peak_rss_bytes"] > 0 and "bytes_read_per_pass" in report


def test_the_tokenizer_lets_go_only_where_the_target_file_cannot_be_held_beside_the_process(tiny_home, monkeypatch):
    target = tiny_home / "models" / "tiny-target.gguf"
    size = target.stat().st_size
    opts = options.LoadOptions(model="tiny", target_backend="llama")
    for budget, surely in [(size + MARGIN + 100, False), (size + MARGIN + 99, True)]:  # a process of 100 bytes
        monkeypatch.setattr(load_plan, "ram_budget", lambda: ram.RamBudget(budget, "test"))
        assert load_plan.streams_surely(target, opts, 100) == surely
    assert not load_plan.streams_surely(target, replace(opts, target_backend="torch"), 100)  # a torch target reads no GGUF vocabulary


def test_a_streaming_target_answering_known_prompts_gets_a_context_sized_to_them(tiny_home, monkeypatch):
    spec, prompt = DraftSpec("best-first", 4), MESSAGES[0]["content"]
    answers = options.Answers((prompt,), 24)
    with ondevice.load("tiny", answers=answers, target_backend="llama", threads=1) as pipe:
        assert pipe.memory.target_in_ram and pipe.engine.target.n_ctx == options.DEFAULT_CTX  # in RAM: nothing to win
    with ondevice.load("tiny", streaming_ctx=512, target_backend="llama", threads=1) as pipe:
        assert pipe.memory.target_in_ram and pipe.engine.target.n_ctx == options.DEFAULT_CTX  # chat's, in RAM: the same
    stream_tiny_target(tiny_home, monkeypatch)
    with ondevice.load("tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=options.DEFAULT_CTX, keep_drafter=True) as pipe:
        full, _ = answer(pipe, spec)
        full_plan = pipe.memory
    with ondevice.load("tiny", answers=answers, target_backend="llama", drafter_backend="llama", threads=1, keep_drafter=True) as pipe:
        n_ctx = pipe.engine.target.n_ctx
        need = len(pipe.encode_chat(MESSAGES)) + 24 + pipe.memory.sizes.max_tree + 1
        assert need <= n_ctx < need + 16 + 256 and n_ctx < options.DEFAULT_CTX
        assert pipe.memory.sizes.n_ctx == n_ctx and pipe.engine.drafter.model.n_ctx == n_ctx
        assert pipe.memory.buffers["target KV cache"] < full_plan.buffers["target KV cache"]
        sized, stats = answer(pipe, spec)
        assert pipe.stats_json(stats)["placement"]["n_ctx"] == n_ctx
    assert sized == full  # the KV cache's size changes what stays cached, never the answer
    chat = dict(target_backend="llama", drafter_backend="llama", threads=1, keep_drafter=True, streaming_ctx=512)  # ondevice chat's
    with ondevice.load("tiny", **chat) as pipe:  # no answers known: the streaming context asked for
        assert pipe.engine.target.n_ctx == 512 and pipe.memory.sizes.n_ctx == 512
        assert answer(pipe, spec)[0] == full
    with ondevice.load("tiny", **chat | {"ctx": 1024}) as pipe:  # --ctx wins
        assert pipe.engine.target.n_ctx == 1024


def least_budget_keeping_the_head(target: ModelSize, drafter: ModelSize, n_ctx: int) -> int:
    """The smallest RAM budget whose plan at this context keeps the target's LM head in RAM: there
    the target streams (asserted), its head kept."""
    def plan(budget: int) -> memory.MemoryPlan:
        return memory.plan_memory(target, drafter, n_ctx=n_ctx, budget=ram.RamBudget(budget, "test"),
                                  process_bytes=200 << 20, ahead=load_plan.WINDOW_AHEAD)
    low, high = 200 << 20, 4 << 30
    assert plan(high).head_in_ram and not plan(low).head_in_ram
    while low + 1 < high:
        low, high = (low, (low + high) // 2) if plan((low + high) // 2).head_in_ram else ((low + high) // 2, high)
    assert plan(high).streams
    return high


def write_deep_pair(home, monkeypatch) -> tuple[ModelSize, ModelSize]:
    """A tiny pair "deep" of 8 layers (enough to stream a few with the LM head kept) in ONDEVICE_HOME=home;
    its (target, drafter) sizes. The process counts as 200 MB from then on."""
    monkeypatch.setenv("ONDEVICE_HOME", str(home))
    monkeypatch.setitem(tiny_models.DIMS, "num_hidden_layers", 8)
    write_tiny_pair(home, "deep", arch="llama", head_scale=3.0)
    monkeypatch.setattr(memory, "anon_rss", lambda: 200 << 20)
    monkeypatch.setattr(pair, "anon_rss", lambda: 200 << 20)
    return tuple(ModelSize.from_gguf(home / "models" / f"deep-{role}.gguf") for role in ("target", "drafter"))


def test_a_chat_whose_context_would_stream_the_lm_head_gets_a_shorter_one_that_keeps_it(tmp_path, monkeypatch):
    target, drafter = write_deep_pair(tmp_path, monkeypatch)
    spec = DraftSpec("best-first", 4)
    with ondevice.load("deep", target_backend="llama", threads=1, ctx=256) as pipe:
        in_ram, _ = answer(pipe, spec)
    least = {n_ctx: least_budget_keeping_the_head(target, drafter, n_ctx) for n_ctx in (1024, 768, 512)}
    assert least[1024] > least[768] > least[512]
    chat = dict(target_backend="llama", drafter_backend="llama", threads=1, keep_drafter=True, streaming_ctx=1024)
    for budget, n_ctx, head in [(least[1024], 1024, True), (least[768], 768, True), (least[512], 512, True),
                                (least[512] - 1, 1024, False)]:  # no context keeps it: the longest
        monkeypatch.setattr(load_plan, "ram_budget", lambda: ram.RamBudget(budget, "test"))
        with ondevice.load("deep", **chat) as pipe:
            assert pipe.memory.streams and pipe.engine.target.window is not None
            assert pipe.engine.target.n_ctx == n_ctx and pipe.memory.head_in_ram == head
            assert ("-stream-paged-" in pipe.auto_planner().regime) == (not head)  # measured rates of another regime
            assert answer(pipe, spec)[0] == in_ram
    monkeypatch.setattr(load_plan, "ram_budget", lambda: ram.RamBudget(least[768], "test"))
    with ondevice.load("deep", **chat | {"ctx": 1024}) as pipe:  # --ctx wins
        assert pipe.engine.target.n_ctx == 1024 and not pipe.memory.head_in_ram


def ship_tiny_keep_set(home, monkeypatch, name: str = "tiny"):
    """The tiny pair's catalog ships a keep set (every third id), as the default pair's does; no
    trimmed drafter is built yet. Returns (the drafter's path, the kept ids)."""
    monkeypatch.setattr(shipped, "SHIPPED_DIR", home / "shipped")
    drafter = choose(name, None, None, True).drafter
    keep = np.union1d(build.always_kept_ids(gguf.GGUFReader(drafter)), np.arange(0, 320, 3))
    built = build.build_trimmed(drafter, keep, "test: every third id")
    (home / "shipped").mkdir()
    shipped.export(built, name)
    for path in build.trimmed_paths(drafter):  # shipped with the catalog, not built here
        path.unlink()
    return drafter, keep


def test_a_streaming_target_drafts_with_the_trimmed_drafter_its_catalog_ships(tiny_home, monkeypatch):
    drafter, keep = ship_tiny_keep_set(tiny_home, monkeypatch)
    assert shipped.shipped_keep_ids("tiny", "0" * 64) is None  # for another drafter file: nothing
    with ondevice.load("tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=True) as pipe:
        assert pipe.memory.target_in_ram and not pipe.engine.drafter.model.vocab_trimmed
    assert build.find_trimmed(drafter) is None  # in RAM the full drafter drafts: nothing written
    stream_tiny_target(tiny_home, monkeypatch)
    with ondevice.load("tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=True) as pipe:
        assert pipe.memory.streams and pipe.engine.drafter.model.vocab_trimmed
        trimmed, record = build.trimmed_paths(drafter)
        assert pipe.memory.drafter_bytes == trimmed.stat().st_size < drafter.stat().st_size
        streamed, _ = answer(pipe, DraftSpec("best-first", 4))
    assert build.TrimmedVocab.load(record).keep_ids == tuple(int(i) for i in keep)
    with ondevice.load("tiny", target_backend="llama", draft=False, threads=1, ctx=256) as alone:
        assert streamed == answer(alone, None)[0]


def test_a_drafter_trimmed_to_an_earlier_shipped_set_is_trimmed_again_and_a_users_own_trim_stays(tiny_home, monkeypatch):
    drafter, keep = ship_tiny_keep_set(tiny_home, monkeypatch)
    sha256, record = build.file_sha256(drafter), build.trimmed_paths(drafter)[1]
    earlier = np.union1d(build.always_kept_ids(gguf.GGUFReader(drafter)), np.arange(1, 320, 3))
    build.build_trimmed(drafter, earlier, f"an earlier catalog's set {shipped.SHIPPED_NOTE}")
    assert shipped.trim_for_streaming("tiny", drafter, sha256)
    assert build.TrimmedVocab.load(record).keep_ids == tuple(int(i) for i in keep)
    assert not shipped.trim_for_streaming("tiny", drafter, sha256)  # now the shipped set's: nothing to write
    build.build_trimmed(drafter, earlier, "test: the user's own calibration")
    assert not shipped.trim_for_streaming("tiny", drafter, sha256)
    assert build.TrimmedVocab.load(record).keep_ids == tuple(int(i) for i in earlier)


def test_a_load_plans_for_the_drafter_trimmed_again_during_it(tiny_home, monkeypatch):
    """The load's first plan (does the target stream?) sees the drafter trimmed to an earlier shipped
    set; the plan it loads with must count the drafter trimmed again, not the file of that name before."""
    drafter, keep = ship_tiny_keep_set(tiny_home, monkeypatch)
    fewer = np.union1d(build.always_kept_ids(gguf.GGUFReader(drafter)), np.arange(0, 320, 6))
    build.build_trimmed(drafter, fewer, f"an earlier catalog's set {shipped.SHIPPED_NOTE}")
    trimmed, record = build.trimmed_paths(drafter)
    before = trimmed.stat().st_size
    stream_tiny_target(tiny_home, monkeypatch)
    with ondevice.load("tiny", target_backend="llama", drafter_backend="llama", threads=1, ctx=256, keep_drafter=True) as pipe:
        assert build.TrimmedVocab.load(record).keep_ids == tuple(int(i) for i in keep)
        assert pipe.memory.drafter_bytes == trimmed.stat().st_size > before


DISK_BOUND = curve({1: 0.80, 2: 0.80, 4: 0.81, 8: 0.83, 16: 0.86, 32: 0.92, 64: 1.02})  # a streamed pass: the disk dominates


def test_a_streaming_target_never_exports_the_onnx_drafter_to_compare_it(tiny_home, monkeypatch):
    """Exporting peaks at ~3x the drafter file in RAM: under the limit the target streams in, it was
    killed (0.9 GB cgroup, the default pair in a fresh home). The llama.cpp drafter drafts, unmeasured."""
    monkeypatch.setattr(profile_store, "measure_ram_bandwidth", lambda: measure_ram_bandwidth(8 << 20))
    stream_tiny_target(tiny_home, monkeypatch)
    opts = options.LoadOptions(model="tiny", threads=1, ctx=256)
    models = choose("tiny", None, None, True)
    assert choices.pick_backends(opts, models, 1, load_plan.MemoryPlans(models, opts)) == ("llama", "llama")
    assert not export_dir(models.drafter).exists()


def test_a_streaming_target_measures_both_drafters_alone_and_the_faster_drafts(tiny_home, monkeypatch):
    monkeypatch.setattr(profile_store, "measure_ram_bandwidth", lambda: measure_ram_bandwidth(8 << 20))
    stream_tiny_target(tiny_home, monkeypatch)
    opts = options.LoadOptions(model="tiny", threads=1, ctx=256)
    models = choose("tiny", None, None, True)
    OnnxDrafter(models.drafter, n_ctx=256, threads=1, vocab_trim=True, show=False).close()  # exported while RAM allowed
    assert choices.onnx_drafter_built(models.drafter, vocab_trim=True)
    before = ondevice_threads()
    choices.pick_backends(opts, models, 1, load_plan.MemoryPlans(models, opts))  # nothing saved: measures the streamed target, then each drafter
    assert left_running(before) == []  # the measured target is gone, with its page-cache thread
    (path,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
    measured = Profile.from_dict(json.loads(path.read_text()))
    assert set(measured.targets) == {"llama"} and set(measured.drafters) == {"llama", "onnx"}
    assert measured.target_placement == "disk"
    for faster in ("onnx", "llama"):  # the choice follows the curves, timing-free: written, not measured
        measured.targets = {"llama": DISK_BOUND}
        measured.drafters = {"llama": FAST_DRAFT if faster == "llama" else SLOW_DRAFT, "onnx": FAST_DRAFT if faster == "onnx" else SLOW_DRAFT}
        measured.curves = measured.curves_for("llama", faster)
        save_profile(measured)
        with ondevice.load("tiny", threads=1, ctx=256, keep_drafter=True) as pipe:
            assert pipe.memory.streams and pipe.info["drafter_backend"] == faster and pipe.target_backend == "llama"
            spec = pipe.resolve(DraftSpec("auto", 0), Sampling())
            assert spec is not None and spec.builder != "lookup"  # a flat, disk-bound curve: the drafter drafts


def test_a_streaming_target_drafts_with_the_drafter_that_leaves_it_the_most_ram(tiny_home, monkeypatch):
    monkeypatch.setattr(profile_store, "measure_ram_bandwidth", lambda: measure_ram_bandwidth(8 << 20))
    monkeypatch.setitem(tiny_models.DIMS, "num_hidden_layers", 8)  # layers enough for a plan to keep some
    write_tiny_pair(tiny_home, name="deep", arch="llama", head_scale=3.0)
    ship_tiny_keep_set(tiny_home, monkeypatch, "deep")
    target = ModelSize.from_gguf(tiny_home / "models" / "deep-target.gguf")
    drafter = ModelSize.from_gguf(tiny_home / "models" / "deep-drafter.gguf")
    smallest = min(memory.TREE_SIZES)  # the plan gives up tree size before the head: short of it even at the smallest tree
    decode_slack = recycle.table_bytes(target.n_vocab) + memory.DECODE_COPIES * smallest * target.n_vocab * memory.F32  # what kept layers leave for decoding
    largest = max(memory.TREE_SIZES)
    buffers = {t: sum(memory._buffers(target, drafter, 256, memory.context_sizes(256, t, streams=True), memory.F16).values()) for t in (largest, smallest)}
    stream_tiny_target(tiny_home, monkeypatch, "deep",  # the head, less a byte
                       extra=max(target.layer_bytes) + target.head_bytes - 1 + decode_slack - (buffers[largest] - buffers[smallest]))
    opts = options.LoadOptions(model="deep", threads=1, ctx=256)
    models = choose("deep", None, None, True)
    plans = load_plan.MemoryPlans(models, opts)
    assert choices.leanest_drafters(plans, "llama") == ("llama",)  # the ONNX drafter is not exported: not a candidate
    OnnxDrafter(models.drafter, n_ctx=256, threads=1, vocab_trim=True, show=False).close()
    assert choices.leanest_drafters(plans, "llama") == ("llama", "onnx")  # untrimmed, both leave the same
    choices.shrink_drafter_if_streaming(models, opts, plans)
    trimmed = plans.plan("llama", "llama")
    assert trimmed.bytes_read_per_pass < plans.plan("llama", "onnx").bytes_read_per_pass
    assert choices.leanest_drafters(plans, "llama") == ("llama",)  # trimmed, it leaves room for the LM head
    assert choices.pick_backends(opts, models, 1, plans) == ("llama", "llama")
    assert not list((tiny_home / "profiles").glob("*.json"))  # decided by memory: no drafter was loaded to be measured

    def not_here(*args, **kwargs):
        raise AssertionError("a streaming target's profile is measured in a child process, not in the one that serves")

    monkeypatch.setattr(profile_store, "measure_profile", not_here)
    with ondevice.load("deep", threads=1, ctx=256, keep_drafter=True) as pipe:
        assert pipe.info["drafter_backend"] == "llama" and pipe.engine.drafter.model.vocab_trimmed
        assert pipe.memory.bytes_read_per_pass == trimmed.bytes_read_per_pass
        pipe.resolve(DraftSpec("auto", 0), Sampling())  # uses the profile the child measured and saved
    (path,) = (tiny_home / "profiles").glob("*-deep-cpu-t1-stream*.json")
    measured = Profile.from_dict(json.loads(path.read_text()))
    assert set(measured.drafters) == {"llama"}
    measured.targets = {"llama": DISK_BOUND}
    measured.drafters = {"llama": SLOW_DRAFT, "onnx": FAST_DRAFT}  # ONNX Runtime drafting faster does not win back the RAM
    save_profile(measured)
    with ondevice.load("deep", threads=1, ctx=256, keep_drafter=True) as pipe:
        assert pipe.info["drafter_backend"] == "llama"
    OnnxDrafter(models.drafter, n_ctx=256, threads=1, vocab_trim=True, show=False).close()  # exported with the trimmed head
    stream_tiny_target(tiny_home, monkeypatch, "deep")  # room for no layer and no head, whichever drafter
    paged = load_plan.MemoryPlans(models, opts)
    assert not paged.plan("llama", "llama").head_in_ram and paged.plan("llama", "llama").kept_layer_count == 0
    assert paged.plan("llama", "llama").bytes_read_per_pass == paged.plan("llama", "onnx").bytes_read_per_pass
    assert choices.leanest_drafters(paged, "llama") == ("llama",)  # both read the whole file: the smaller leaves the pages more


def test_a_streaming_profile_times_the_trees_the_load_plans(tiny_home, monkeypatch):
    """The child times the target under the parent's own memory plan (where the drafter's room holds
    its interpreter), and a saved profile whose passes stop short of the plan's trees is timed anew:
    otherwise the planner cannot price a tree past the last size timed."""
    monkeypatch.setattr(profile_store, "measure_ram_bandwidth", lambda: measure_ram_bandwidth(8 << 20))
    stream_tiny_target(tiny_home, monkeypatch)
    opts = options.LoadOptions(model="tiny", threads=1, ctx=256, keep_drafter=True, drafter_backend="llama")
    models = choose("tiny", None, None, True)
    plan = choices.plan_load(opts, models, 200 << 20)
    assert plan.streams and profiling.child_plan(plan).memory is None  # a tiny drafter's room holds no interpreter: planned apart
    assert profiling.child_plan(replace(plan, memory=replace(plan.memory, drafter_bytes=300 << 20))).memory.drafter_bytes == 300 << 20
    monkeypatch.setattr(profiling, "child_plan", lambda plan: plan)  # as for the default pair: the parent's own plan
    profile = profiling.streaming_profile(plan)
    timed = profile.targets["llama"]
    assert profiling.times_trees_of(timed, plan.memory.sizes.max_tree)
    (path,) = (tiny_home / "profiles").glob("*-tiny-cpu-t1-stream*.json")
    data = json.loads(path.read_text())
    data["targets"]["llama"] = {"ns": [1, 2], "seconds": [0.5, 0.5]}  # a profile timed under smaller buffers
    path.write_text(json.dumps(data))
    again = profiling.streaming_profile(plan).targets["llama"]
    assert again.max_n > 2 and profiling.times_trees_of(again, plan.memory.sizes.max_tree)


def test_a_curve_covers_a_plan_up_to_its_trees_or_where_no_tree_could_pay():
    flat = curve({1: 0.5, 2: 0.5, 4: 0.51, 8: 0.52})
    assert profiling.times_trees_of(flat, 8) and not profiling.times_trees_of(flat, 32)
    steep = curve({1: 0.01, 2: 0.05, 4: 0.3})  # a 4-token pass costs 30 single ones: the sweep stopped there on purpose
    assert profiling.times_trees_of(steep, 64)
