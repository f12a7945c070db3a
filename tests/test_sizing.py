"""Free rounds sized to their pass (draft/sizing.py): the kept prefix against a brute force over every
subtree, the router's sized rounds, the planner's specs, and exactness of sized decoding."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from ondevice.draft.free_tree import FreeTrie
from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.draft.router import DraftRouter
from ondevice.draft.sizing import SizingRecord, best_size, sized
from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from ondevice.eval.free_ceiling import ceiling_seconds, sized_seconds
from ondevice.plan import auto as autoplan
from ondevice.loading.drafter_room import ALONE_CONTEXT
from ondevice.plan.curve import Curves, LatencyCurve
from ondevice.plan.fallback import MAX_LOOKUP_BUDGET, follow
from ondevice.plan.arms import arm_of
from ondevice.decode.protocols import TARGET_FREE, DraftSpec, config_label
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling
from tiny_models import write_tiny_gguf


def random_best_first_tree(rng, n_nodes: int) -> DraftTree:
    """A random tree with steps ≤ 0, re-ordered best-first as the free sources return theirs."""
    trie = FreeTrie(0)
    nodes = [0]
    for token in range(1, n_nodes + 1):
        nodes.append(trie.add(int(rng.choice(nodes)), token, float(np.log(rng.uniform(0.05, 1.0)))))
    return trie.best(n_nodes)


def subtrees(tree: DraftTree):
    """Every ancestor-closed set of drafted nodes (the root always in)."""
    for mask in itertools.product([False, True], repeat=len(tree) - 1):
        keep = [True, *mask]
        if all(not keep[i] or keep[int(tree.parents[i])] for i in range(1, len(tree))):
            yield [i for i in range(1, len(tree)) if keep[i]]


@pytest.mark.parametrize("seed", range(12))
def test_the_kept_prefix_pays_best_of_every_subtree(seed):
    """Brute force: of all subtrees, none has a higher expected tokens per second than the prefix."""
    rng = np.random.default_rng(seed)
    tree = random_best_first_tree(rng, int(rng.integers(3, 10)))
    per_token = rng.uniform(0.05, 1.0)  # from flat (a streamed pass) to steep (a CPU in RAM)
    pass_seconds = [1.0 + per_token * k ** rng.uniform(0.7, 1.3) for k in range(len(tree))]
    p = np.exp(tree.logprobs)
    best = max((1.0 + p[s].sum()) / pass_seconds[len(s)] for s in subtrees(tree))
    n = best_size(tree.logprobs[1:], pass_seconds)
    assert (1.0 + p[1 : n + 1].sum()) / pass_seconds[n] == pytest.approx(best, rel=1e-12)
    kept = sized(tree, pass_seconds)
    assert len(kept) == n + 1 and all(int(kept.parents[i]) < i for i in range(1, len(kept)))


def test_flat_passes_keep_the_whole_tree_and_linear_ones_the_root():
    rng = np.random.default_rng(0)
    tree = random_best_first_tree(rng, 8)
    assert len(sized(tree, [1.0] * 9)) == 9  # a pass costs the same for 1 or 9 tokens: every node pays
    assert len(sized(tree, [1.0 + k for k in range(9)])) == 1  # n tokens cost n passes: no guess below 1 pays


def test_router_grows_a_free_round_as_a_copy_goes_on():
    """A steep curve, an answer that copies its prompt: the first round (a 6-token match, ~0.86 a
    step) buys a few nodes; as the match lengthens and the source's record shows its copies come
    true, the rounds buy longer chains. Without pass times: the whole budget, as before."""
    rng = np.random.default_rng(1)
    text = rng.integers(10, 390, size=80).tolist()
    route = DraftRouter(None, PromptLookupDrafter(400))
    spec = DraftSpec("suffix", 16, pass_seconds=tuple(1.0 + 0.5 * k for k in range(17)))
    pos, sizes = 6, []
    context = text + [1] + text[:pos]
    while pos < 60:
        tree = route.draft(context, spec)
        emitted = len(follow(tree, text[pos:]))  # the accepted drafts and the target's own token
        context, pos = context + text[pos : pos + emitted], pos + emitted
        sizes.append(len(tree) - 1)
    assert 0 < sizes[0] < 16 and sizes[-1] > sizes[0]
    assert route.record.rate("suffix", float(np.log(0.86))) > 0.86  # its guesses came true
    assert len(route.draft(context, DraftSpec("suffix", 16))) == 17


def test_the_target_alones_round_sizes_the_merged_free_tree():
    """TARGET_FREE: lookup's and the suffix index's proposals merged and priced (as hybrid trees are
    seeded), then sized: a flat pass keeps them all, a pass that costs n single ones keeps the root."""
    context = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    merged = DraftRouter(None, PromptLookupDrafter(400)).draft(context, DraftSpec("hybrid", 6))
    flat = DraftRouter(None, PromptLookupDrafter(400)).draft(context, DraftSpec(TARGET_FREE, 6, pass_seconds=(1.0,) * 7))
    assert flat.tokens.tolist() == merged.tokens.tolist() and len(flat) > 2
    linear = DraftRouter(None, PromptLookupDrafter(400)).draft(context, DraftSpec(TARGET_FREE, 6, pass_seconds=tuple(range(1, 8))))
    assert len(linear) == 1


def test_router_sends_a_weak_match_to_the_root_alone():
    """Bigram matches that continue three ways: no node is worth a 1.5x pass."""
    route = DraftRouter(None, PromptLookupDrafter(400))
    context = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 9, 3, 5, 6]
    tree = route.draft(context, DraftSpec("lookup", 6, pass_seconds=tuple(1.0 + 0.5 * k for k in range(7))))
    assert len(tree) == 1


def test_the_sizing_record_scales_by_what_the_verified_drafts_accepted():
    """Rounds that accept half the drafts they were expected to: the scale goes to about one half and
    a tree worth three nodes at face value is cut to its root; rounds that accept all: about 1. A
    record that drafts nothing for a few hundred rounds trusts the sources again."""
    half, full = SizingRecord(), SizingRecord()
    for _ in range(200):
        half.sized("suffix", 2.0)
        half.verified(1)
        full.sized("suffix", 2.0)
        full.verified(2)
    assert half.scale("suffix") == pytest.approx(0.5, abs=0.05) and full.scale("suffix") == pytest.approx(1.0)
    assert half.scale("lookup") == 1.0  # per builder
    steps = np.log([0.9, 0.81, 0.73])  # a chain, path probabilities
    pass_seconds = [1.0, 1.5, 2.0, 2.5]
    assert best_size(steps, pass_seconds) == 3 and best_size(steps, pass_seconds, half.scale("suffix")) == 0
    for _ in range(1000):
        half.sized("suffix", 0.0)  # rounds sized to the root: nothing verified, the record fades
        half.verified(0)
    assert half.scale("suffix") > 0.95


def test_a_router_whose_sized_rounds_accept_nothing_stops_buying_drafts():
    """The same confident match, verified again and again with no draft accepted (the source's own
    record sees none of it: the context does not go on): the router's rounds shrink to the root,
    while a new router still buys nodes for it."""
    context = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 9, 1, 2, 3]
    spec = DraftSpec("lookup", 6, pass_seconds=tuple(1.0 + 0.5 * k for k in range(7)))
    route = DraftRouter(None, PromptLookupDrafter(400))
    sizes = []
    for _ in range(12):
        tree = route.draft(context, spec)
        sizes.append(len(tree) - 1)
        route.learn(tree, np.zeros((len(tree), 400), dtype=np.float32), [0])
    assert sizes[0] > 1 and sizes[-1] == 0
    assert len(DraftRouter(None, PromptLookupDrafter(400)).draft(context, spec)) - 1 == sizes[0]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from ondevice.targets.llama_target import LlamaTarget

    path = tmp_path_factory.mktemp("tiny") / "qwen2.gguf"
    write_tiny_gguf(path, arch="qwen2", head_scale=3.0)
    return LlamaTarget(path, n_ctx=512, threads=1)


def decode(engine: SpecEngine, prompt, n, spec=None, sampling=Sampling()):
    engine.cached = []
    return collect(engine.generate(prompt, n, sampling, spec, "specexec"))[0]


@pytest.mark.parametrize("builder", ["lookup", "suffix", TARGET_FREE])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_sized_free_rounds_decode_exactly_what_the_target_alone_does(tiny_target, builder, temperature):
    """A flat curve (every node kept) and a mildly steep one (trees cut): the target alone's tokens."""
    alone = SpecEngine(tiny_target, None, lambda t: False)
    sampling = Sampling(temperature=temperature, seed=5)
    prompt = [5, 60, 61, 7, 200, 33, 5, 60, 61, 7, 200, 33, 5, 60]
    reference = decode(alone, prompt, 40, sampling=sampling)
    for curve in ([1.0] * 9, [1.0 + 0.1 * k for k in range(9)]):
        engine = SpecEngine(tiny_target, DraftRouter(None, PromptLookupDrafter(tiny_target.n_vocab)), lambda t: False)
        spec = DraftSpec(builder, 8, temperature=temperature, seed=5, pass_seconds=tuple(curve))
        assert decode(engine, prompt, 40, spec, sampling) == reference


# --- the planner: a free arm's rounds carry the pass times they are sized by ------------------------
CURVE = LatencyCurve((1, 2, 4, 8, 16, 32), (0.030, 0.058, 0.090, 0.210, 0.270, 0.450))
DRAFTER = LatencyCurve((1, 2, 4, 8, 16, 32), (0.020, 0.038, 0.050, 0.082, 0.121, 0.207))


@pytest.mark.parametrize("max_tree, budget, cap", [(32, None, MAX_LOOKUP_BUDGET), (7, None, 6), (32, 4, 4)])
def test_the_planners_free_rounds_are_sized(tmp_path, monkeypatch, max_tree, budget, cap):
    """The target alone's rounds verify the free sources' merged tree and a free arm's its source's,
    up to the cap (MAX_LOOKUP_BUDGET, the target's largest tree, or --budget), sized by the target's
    rescaled curve plus the per-pass overhead; the first are booked to the target alone."""
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    profile = SimpleNamespace(curves=Curves(CURVE, DRAFTER), overlap_possible=False, busy=False, target_context=64)
    monkeypatch.setattr(autoplan, "saved_profile", lambda backends: profile)
    backends = SimpleNamespace(pair="toy", memory=None, max_tree=max_tree, make_decode_batch=lambda: None, model_files=None)
    planner = autoplan.AutoPlanner(backends)
    spec = planner.spec(Sampling(temperature=0.5, seed=9), context=40, budget=budget)
    assert planner.playing == "target"
    assert spec.builder == TARGET_FREE and spec.budget == cap and len(spec.pass_seconds) == cap + 1
    assert (spec.temperature, spec.seed) == (0.5, 9)
    curve = planner.pass_times.curve(planner.context)
    expected = [curve(k) + planner.overhead_per_pass for k in range(1, cap + 2)]
    assert list(spec.pass_seconds) == pytest.approx(expected)
    assert arm_of(spec) == "target" and config_label(spec) == "target+free"
    free = next(arm for arm in planner.plans if arm in autoplan.FREE_ARMS)
    monkeypatch.setattr(planner.book, "next_arm", lambda prices, **kwargs: (free, False))
    arm = planner.replan()
    assert arm.builder == free and arm.pass_seconds == spec.pass_seconds and arm.budget == cap and arm_of(arm) == free


def test_the_ceiling_and_the_sized_replay_of_a_copied_answer():
    """eval/free_ceiling.py on an answer that copies its prompt: on a flat curve the ceiling needs a
    pass for each of the two tokens before the copy is found and one for the rest; where n tokens
    cost n passes no free draft can save anything, and the sized rounds draft none."""
    text = np.random.default_rng(3).integers(10, 390, size=60).tolist()
    answers = [(text + [1], text[:40])]
    assert ceiling_seconds(answers, LatencyCurve((1, 64), (1.0, 1.0))) == (3.0, 3)
    linear = LatencyCurve((1, 64), (1.0, 64.0))
    assert ceiling_seconds(answers, linear)[0] == pytest.approx(40.0)
    assert sized_seconds(answers, linear, 400) == (pytest.approx(40.0), 40)
    seconds, passes = sized_seconds(answers, LatencyCurve((1, 64), (1.0, 1.0)), 400)
    assert passes < 8 and seconds == passes


def test_without_a_measured_curve_the_rounds_are_not_sized(tmp_path, monkeypatch):
    """No profile (a model without a drafter, before any profile): on the provisional curve no node
    would ever pay, and the free arms' fixed trees are what teaches the curve, so nothing is sized."""
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setattr(autoplan, "saved_profile", lambda backends: None)
    backends = SimpleNamespace(pair="toy", memory=None, max_tree=32, make_decode_batch=None, model_files=None)
    planner = autoplan.AutoPlanner(backends)
    assert planner.spec(Sampling(), context=40) is None
    report = SimpleNamespace(tree=DraftTree.root_only(1), path=[0], spec=None, pass_seconds=0.1, round_seconds=0.1, context=40)
    planner.observe(report)  # one pass: the provisional curve is priced
    assert planner.replan() is None
    free = next(arm for arm in planner.plans if arm in autoplan.FREE_ARMS)
    monkeypatch.setattr(planner.book, "next_arm", lambda prices, **kwargs: (free, False))
    spec = planner.replan()
    assert spec.builder == free and spec.pass_seconds is None and spec.budget == planner.plans[free].budget


@pytest.mark.parametrize("timed", [True, False])
def test_a_drafter_less_streaming_load_sizes_its_rounds_on_the_passes_timed_at_load(tmp_path, monkeypatch, timed):
    """A target streaming without the drafter model has no profile: its rounds are sized on the
    passes timed at load (AlonePass.curve, backends.lean_curve), where 2 tokens cost what 1 does; with
    nothing timed they stay unsized, as the provisional curve would draft nothing."""
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    monkeypatch.setattr(autoplan, "saved_profile", lambda backends: None)
    lean = LatencyCurve((1, 2, 3, 4, 5, 8, 9, 16, 17), (0.10, 0.10, 0.115, 0.133, 0.156, 0.285, 0.29, 0.30, 0.38))
    backends = SimpleNamespace(pair="toy", memory=SimpleNamespace(streams=True), max_tree=32, make_decode_batch=None,
                               model_files=None, lean_curve=lean if timed else None)
    planner = autoplan.AutoPlanner(backends)
    monkeypatch.setattr(planner.book, "next_arm", lambda prices, **kwargs: ("target", False))
    spec = planner.spec(Sampling(), context=ALONE_CONTEXT)
    assert planner.profile_state == ("measured" if timed else "none") and "not loaded" in planner.plan.fallback_reason
    if not timed:
        assert spec is None
        return
    assert spec.builder == TARGET_FREE and spec.budget == MAX_LOOKUP_BUDGET and arm_of(spec) == "target"
    assert list(spec.pass_seconds) == pytest.approx([lean(k) + planner.overhead_per_pass for k in range(1, MAX_LOOKUP_BUDGET + 2)])
