"""Prompt lookup: the drafter on hand-made contexts, its verification (greedy, SpecExec, Sequoia),
routing, and exactness against the target alone (tiny GGUF models; and, marked `real`, the real
models as llama.cpp targets on a code rewrite). The planner's fallback to it: test_fallback.py."""

from __future__ import annotations


import numpy as np
import pytest

from ondevice.cli.decoding import make_spec
from ondevice.draft.model_drafter import check_spec
from ondevice.draft.lookup import PromptLookupDrafter, find_matches
from ondevice.draft.router import DraftRouter
from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from ondevice.errors import OndeviceError
from ondevice.eval.numerics import greedy_misses, pass_noise
from ondevice.plan.acceptance import AcceptanceTracker
from ondevice.decode.protocols import DraftSpec, Drafter
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling, target_probs, verify_sequoia, verify_specexec
from tiny_models import write_tiny_gguf

LOOKUP = DraftSpec("lookup", 6)


def draft(context, budget=6, **kwargs) -> DraftTree:
    return PromptLookupDrafter(n_vocab=400, **kwargs).draft(context, DraftSpec("lookup", budget))


def paths(tree: DraftTree) -> list[list[int]]:
    """Token sequences root-excluded of every root→leaf path."""
    return [[int(tree.tokens[n]) for n in tree.path_to(leaf)[1:]] for leaf in tree.leaves()]


# --- the drafter ------------------------------------------------------------------------------
def test_proposes_what_followed_the_last_ngram():
    context = [10, 11, 12, 13, 14, 20, 30, 10, 11, 12]
    tree = draft(context, budget=3)
    assert tree.tokens[0] == 12 and paths(tree) == [[13, 14, 20]]


def test_continuation_may_run_into_the_suffix_itself():
    tree = draft([6, 7, 8, 7, 8, 7, 8], budget=5)  # "8 7 8" occurred once before, ending at index 4
    assert paths(tree) == [[7, 8]]  # what followed it: the suffix itself (all the context has)
    tree = draft([6, 7, 8, 7, 8, 7, 8], budget=5, max_ngram=2)  # "7 8": two earlier occurrences
    assert paths(tree) == [[7, 8, 7, 8]]  # → "7 8" (newer) and "7 8 7 8" (older) merge into one path


def test_longest_ngram_wins_over_more_recent_shorter_ones():
    context = [1, 2, 3, 50, 9, 2, 3, 60, 1, 2, 3]  # trigram "1 2 3" → 50; bigram "2 3" also → 60 (newer)
    assert find_matches(np.array(context))[0] == 3
    assert paths(draft(context, budget=1)) == [[50]]


def test_no_match_gives_a_root_only_tree():
    assert len(draft([1, 2, 3, 4, 5])) == 1
    assert len(draft([5, 7, 8, 5])) == 1  # only a unigram recurs; the default minimum is a bigram
    assert paths(draft([5, 7, 8, 5], min_ngram=1)) == [[7, 8, 5]]
    assert len(draft([9])) == 1
    with pytest.raises(OndeviceError):
        draft([])
    with pytest.raises(OndeviceError):
        PromptLookupDrafter(10, max_ngram=1, min_ngram=2)


def test_matches_merge_into_a_trie_ranked_by_support():
    # "1 2" occurs three times before the suffix: → 3 4 5, → 3 4 6, → 3 9 (the most recent)
    context = [1, 2, 3, 4, 5, 70, 1, 2, 3, 4, 6, 71, 1, 2, 3, 9, 72, 1, 2]
    tree = draft(context, budget=3)
    assert sorted(paths(tree)) == [[3, 4], [3, 9]]
    three = tree.children(0)[0]
    kids = tree.children(three)
    by_rank = [int(tree.tokens[c]) for c in sorted(kids, key=lambda c: -tree.logprobs[c])]
    assert by_rank == [4, 9]  # 4 has two occurrences behind it, 9 one (though the most recent)
    tree = draft(context, budget=5)
    four = next(c for c in tree.children(three) if tree.tokens[c] == 4)
    after_four = sorted(tree.children(four), key=lambda c: -tree.logprobs[c])
    assert [int(tree.tokens[c]) for c in after_four][:1] == [6]  # equal support: the more recent first
    assert np.all(tree.logprobs[1:] < tree.logprobs[tree.parents[1:]])  # a path's score only falls


def test_a_majority_continuation_gets_depth_before_a_lone_alternative_gets_breadth():
    context = [1, 2, 3, 4, 5, 6, 70, 1, 2, 3, 4, 5, 6, 71, 1, 2, 3, 9, 72, 1, 2, 3, 4, 5, 6, 73, 1, 2]
    assert paths(draft(context, budget=4)) == [[3, 4, 5, 6]]  # 3 of 4 occurrences go on with 4 5 6
    assert sorted(paths(draft(context, budget=5))) == [[3, 4, 5, 6], [3, 9]]


def test_equal_support_siblings_are_strictly_ordered_for_the_tracker():
    context = [1, 2, 3, 80, 1, 2, 4, 81, 1, 2]  # two occurrences, one each: 4 (newer) then 3
    tree = draft(context, budget=2)
    assert [int(tree.tokens[c]) for c in sorted(tree.children(0), key=lambda c: -tree.logprobs[c])] == [4, 3]
    tracker = AcceptanceTracker(decay=1.0)
    accept_3 = next(c for c in tree.children(0) if tree.tokens[c] == 3)
    tracker.observe(tree, [0, accept_3])
    assert tracker.accepted[:2].tolist() == [0, 1]  # the tracker saw rank 1 accepted


@pytest.mark.parametrize("budget", [1, 2, 5, 6, 13, 30])
def test_budget_caps_the_tree(budget):
    rng = np.random.default_rng(budget)
    block = rng.integers(0, 300, 40).tolist()
    context = block + [301] + block[:5] + [302] + block + [303] + block[:20]  # many overlapping matches
    tree = draft(context, budget=budget)
    assert len(tree) - 1 == budget
    assert tree.depths.max() <= budget
    DraftTree(tree.tokens, tree.parents, tree.logprobs)  # a valid tree (parents first)
    assert len(draft(context, budget=0)) == 1


def test_finds_the_one_earlier_occurrence_in_a_long_context():
    rng = np.random.default_rng(0)
    context = rng.integers(0, 30000, 4000).tolist()
    context += context[1000:1010]
    drafter = PromptLookupDrafter(n_vocab=30000)
    for _ in range(2):  # the second call reuses what the first indexed
        tree = drafter.draft(context, DraftSpec("lookup", 16))
        assert paths(tree) == [context[1010:1026]]


# --- verification rules -----------------------------------------------------------------------
def first_token_frequencies(verify_once, n_vocab: int, runs: int) -> np.ndarray:
    counts = np.zeros(n_vocab)
    for seed in range(runs):
        counts[verify_once(np.random.default_rng(seed)).tokens[0]] += 1
    return counts / runs


@pytest.mark.parametrize("rule", ["specexec", "sequoia"])
def test_sampling_rules_stay_exact_with_lookup_trees(rule):
    """The first emitted token must be distributed as the target's P at the root, whatever the tree."""
    n_vocab, runs = 6, 6000
    context = [1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 3]  # two continuations: → 5 0 1 2 (newer), → 4 0 1 2
    spec = DraftSpec("lookup", 4, temperature=1.0, sample_children=rule == "sequoia")
    tree = PromptLookupDrafter(n_vocab).draft(context, spec)
    logits = np.random.default_rng(1).normal(size=(len(tree), n_vocab)).astype(np.float32)
    sampling = Sampling(temperature=1.0)
    if rule == "sequoia":  # deterministic proposals: the rank-0 chain with one-hot q
        assert paths(tree) == [[5, 0, 1, 2]] and set(tree.q) == {0, 1, 2, 3}
        verify_once = lambda rng: verify_sequoia(tree, logits, sampling, rng)  # noqa: E731
    else:
        assert sorted(paths(tree)) == [[4, 0], [5, 0]] and not tree.q
        verify_once = lambda rng: verify_specexec(tree, logits, sampling, rng)  # noqa: E731
    p = target_probs(logits[0], sampling)
    freq = first_token_frequencies(verify_once, n_vocab, runs)
    assert np.all(np.abs(freq - p) < 4 * np.sqrt(p * (1 - p) / runs) + 1e-3), (freq, p)


def test_sequoia_rule_without_q_is_refused():
    tree = PromptLookupDrafter(6).draft([1, 2, 3, 1, 2], DraftSpec("lookup", 2, temperature=1.0))
    with pytest.raises(ValueError, match="needs the drafter's q"):
        verify_sequoia(tree, np.zeros((len(tree), 6)), Sampling(temperature=1.0), np.random.default_rng(0))


# --- routing ----------------------------------------------------------------------------------
class RecordingDrafter(Drafter):
    n_vocab = 400

    def __init__(self):
        self.specs = []

    def draft(self, context, spec):
        self.specs.append(spec.builder)
        return DraftTree.chain(context[-1], [1] * spec.budget)


def test_router_sends_lookup_to_the_free_drafter_and_the_rest_to_the_model():
    model = RecordingDrafter()
    router = DraftRouter(model, PromptLookupDrafter(400))
    context = [1, 2, 3, 1, 2]
    assert paths(router.draft(context, DraftSpec("lookup", 3))) == [[3, 1, 2]]
    router.draft(context, DraftSpec("chain", 2))
    assert model.specs == ["chain"]
    with pytest.raises(OndeviceError, match="needs the drafter model"):
        DraftRouter(None, PromptLookupDrafter(400)).draft(context, DraftSpec("chain", 2))
    with pytest.raises(OndeviceError, match="unknown draft builder"):
        router.draft(context, DraftSpec("bogus", 2))
    with pytest.raises(OndeviceError, match="drafter model builds"):
        check_spec(DraftSpec("lookup", 4))  # the llama drafter never gets a lookup spec


def test_cli_spec_for_lookup():
    assert make_spec("lookup", None, False, Sampling()) == DraftSpec("lookup", 6)
    assert make_spec("lookup", 3, False, Sampling()).budget == 3
    assert make_spec("lookup", None, True, Sampling()) is None  # --no-draft: the target alone


# --- exactness: the engine with lookup trees vs the target alone -------------------------------
@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_gguf(folder / f"{arch}.gguf", arch=arch, vocab=320) for arch in ("qwen2", "llama")}


def decode(engine: SpecEngine, prompt: list[int], n: int, spec, sampling=Sampling()):
    engine.cached = []
    return collect(engine.generate(prompt, n, sampling, spec))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lookup_decoding_equals_the_target_alone_tiny(tiny_paths, arch, temperature):
    """Greedy: the same argmaxes. SpecExec sampling: one target draw per emitted token whatever the
    tree, so with the same seed even the samples are the same."""
    from ondevice.targets.llama_target import LlamaTarget

    target = LlamaTarget(tiny_paths[arch], n_ctx=512, threads=1)
    engine = SpecEngine(target, DraftRouter(None, PromptLookupDrafter(target.n_vocab)), lambda t: t == 319)
    prompt = [5, 60, 61, 7, 200, 33, 5, 60, 61, 7, 200, 33, 5, 60]
    sampling = Sampling(temperature=temperature, seed=3)
    alone, _ = decode(engine, prompt, 64, None, sampling)
    out, stats = decode(engine, prompt, 64, DraftSpec("lookup", 6, temperature=temperature), sampling)
    assert out == alone
    assert stats.accepted_drafts > 0 or (arch, temperature) == ("llama", 1.0)  # lookup did draft, and it paid


# --- the real pair: a code rewrite, the llama.cpp target ---------------------------------------
REWRITE_PROMPT = """Add type hints to this function. Reply with the whole function only.

```python
def merge_counts(a, b):
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + value
    return out
```"""


@pytest.mark.real
@pytest.mark.parametrize("model", ["drafter", "target"])
def test_lookup_equals_target_alone_on_a_code_rewrite_real(real_pair, model, capsys):
    """Lookup @6 (passes of <= 7 tokens) on the llama.cpp backend, both files as the target. Batched
    passes run other kernels than one-token passes (bit-exact on some CPUs, not on others), so where
    the answers differ, every token of the lookup answer must be the target alone's argmax after its
    own prefix unless the margin there is below this machine's batch noise for passes of 7 tokens."""
    from ondevice.targets.llama_target import LlamaTarget
    from ondevice.prompt.tokenizer import Tokenizer

    path = getattr(real_pair, model)
    tokenizer = Tokenizer(path)
    target = LlamaTarget(path, n_ctx=1024, threads=2)
    engine = SpecEngine(target, DraftRouter(None, PromptLookupDrafter(target.n_vocab)), tokenizer.is_end)
    prompt = tokenizer.encode_user(REWRITE_PROMPT)
    alone, base = decode(engine, prompt, 64, None)
    out, stats = decode(engine, prompt, 64, LOOKUP)
    with capsys.disabled():
        print(f"\n[lookup real, {model} file as target] {stats.tokens} tokens, {stats.tokens_per_pass:.2f} tokens/pass, "
              f"{stats.tokens_per_second:.1f} tok/s vs {base.tokens_per_second:.1f} alone; identical: {out == alone}")
    assert stats.tokens_per_pass > 1.5  # the answer copies the function: lookup must find it
    if out == alone:
        return
    noise = pass_noise(target, prompt, alone, range(2, 8))
    near_ties, misses = greedy_misses(target, prompt, out, noise)
    with capsys.disabled():
        print(f"[lookup real] batch noise (passes of 7) {noise:.3f}; near-ties at {near_ties}")
    assert not misses, (misses, noise)
