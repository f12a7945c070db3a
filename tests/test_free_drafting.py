"""The free builders (suffix, recycle, hybrid) behind the router and in the engine, on tiny GGUF models.

References: the target alone (same engine, root-only trees) for exactness; the target's own logits,
recorded pass by pass, for what token recycling learns through the engine's hook.
"""

from __future__ import annotations

import numpy as np
import pytest

from ondevice.cli.decoding import make_spec
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.draft.recycle import TOP_K
from ondevice.draft.router import DraftRouter
from ondevice.decode.engine import SpecEngine
from ondevice.decode.stats import collect
from ondevice.decode.protocols import DEFAULT_BUDGET, DraftSpec, Drafter
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling, target_probs, verify_sequoia
from tiny_models import write_tiny_gguf

PROMPTS = [[5, 60, 61, 7, 200, 33, 5, 60, 61, 7], [300, 12, 12, 99, 5, 60, 61, 7, 200]]  # the second repeats the first


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    for arch in ("qwen2", "llama"):
        write_tiny_gguf(d / f"{arch}.gguf", arch=arch, head_scale=3.0)
        write_tiny_gguf(d / f"{arch}-twin.gguf", arch=arch, head_scale=3.0, dtype="f16")
    return d


def decode(engine: SpecEngine, prompt, n, spec=None, sampling=Sampling(), rule="specexec"):
    engine.cached = []
    return collect(engine.generate(prompt, n, sampling, spec, rule))


def never_ends(token: int) -> bool:
    return False


def router(target, drafter=None) -> DraftRouter:
    return DraftRouter(drafter, PromptLookupDrafter(target.n_vocab))


# --- exactness ----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("builder", ["suffix", "recycle", "hybrid"])
@pytest.mark.parametrize("overlap", [False, True])
def test_free_and_hybrid_trees_decode_exactly_what_the_target_alone_does(tiny_dir, arch, temperature, builder, overlap):
    """Greedy: the target's argmaxes. SpecExec sampling: one target draw per emitted token whatever the
    tree, so with the same seed the very same tokens. Two answers in one session: the second prompt
    repeats the first, so the session's history (suffix, recycled candidates) is what drafts."""
    from ondevice.targets.llama_target import LlamaTarget

    target = LlamaTarget(tiny_dir / f"{arch}.gguf", n_ctx=512, threads=1)
    drafter = LlamaDrafter(tiny_dir / f"{arch}-twin.gguf", n_ctx=512, threads=1) if builder == "hybrid" else None
    alone = SpecEngine(target, None, never_ends)
    engine = SpecEngine(target, router(target, drafter), never_ends, overlap=overlap)
    sampling = Sampling(temperature=temperature, seed=3)
    spec = DraftSpec(builder, DEFAULT_BUDGET[builder], temperature=temperature, seed=3)
    accepted = 0
    for prompt in PROMPTS:
        reference, _ = decode(alone, prompt, 48, sampling=sampling)
        out, stats = decode(engine, prompt, 48, spec, sampling)
        assert out == reference
        assert stats.drafted_nodes <= stats.target_passes * spec.budget
        accepted += stats.accepted_drafts
    assert accepted > 0  # the trees were not empty, and some of them were right


@pytest.mark.parametrize("builder", ["suffix", "recycle", "hybrid"])
def test_sequoia_rule_verifies_the_free_builders_trees(tiny_dir, builder):
    """sample_children: suffix and recycle give their best chain with point-mass q, hybrid the model's
    sampled tree alone; the Sequoia rule (which refuses a tree without q) runs through."""
    from ondevice.targets.llama_target import LlamaTarget

    target = LlamaTarget(tiny_dir / "llama.gguf", n_ctx=512, threads=1)
    drafter = LlamaDrafter(tiny_dir / "llama-twin.gguf", n_ctx=512, threads=1) if builder == "hybrid" else None
    engine = SpecEngine(target, router(target, drafter), never_ends)
    spec = DraftSpec(builder, 6, temperature=1.0, sample_children=True, seed=1)
    for prompt in PROMPTS:
        out, stats = decode(engine, prompt, 32, spec, Sampling(temperature=1.0, seed=2), rule="sequoia")
        assert len(out) == 32


def test_a_point_mass_chain_keeps_sequoia_exact():
    """The first emitted token must be distributed as the target's P at the root."""
    n_vocab, runs = 6, 6000
    from ondevice.draft.suffix_drafter import SuffixDrafter

    context = [1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 3]
    tree = SuffixDrafter(n_vocab).draft(context, DraftSpec("suffix", 4, temperature=1.0, sample_children=True))
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3] and set(tree.q) == {0, 1, 2, 3}
    logits = np.random.default_rng(1).normal(size=(len(tree), n_vocab)).astype(np.float32)
    sampling = Sampling(temperature=1.0)
    counts = np.zeros(n_vocab)
    for seed in range(runs):
        counts[verify_sequoia(tree, logits, sampling, np.random.default_rng(seed)).tokens[0]] += 1
    p = target_probs(logits[0], sampling)
    assert np.all(np.abs(counts / runs - p) < 4 * np.sqrt(p * (1 - p) / runs) + 1e-3), (counts / runs, p)


# --- the engine's hook: what token recycling learns ---------------------------------------------------


class RecordedTarget:
    """A LlamaTarget whose passes are kept (tree, logits) — the reference for what `learn` saw."""

    def __init__(self, target):
        self.target, self.passes = target, []

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward_tree(self, tree):
        logits = self.target.forward_tree(tree)
        self.passes.append((tree, np.array(logits)))
        return logits


def test_the_engine_teaches_recycling_the_targets_top_k_after_every_drafted_pass(tiny_dir):
    from ondevice.targets.llama_target import LlamaTarget

    target = RecordedTarget(LlamaTarget(tiny_dir / "llama.gguf", n_ctx=512, threads=1))
    route = router(target)
    engine = SpecEngine(target, route, never_ends)
    decode(engine, PROMPTS[0], 24)  # the target alone (no spec): teaches nothing (a top-k per row costs ~0.4 ms)
    assert route.recycler.nbytes == 0
    alone = len(target.passes)
    decode(engine, PROMPTS[1], 24, DraftSpec("recycle", 6))
    table = {}
    for tree, logits in target.passes[alone:]:  # small trees: every row is read; a token seen twice keeps its last row,
        path = [0]  # the accepted path's rows last
        while True:
            kids = [c for c in tree.children(path[-1]) if tree.tokens[c] == int(np.argmax(logits[path[-1]]))]
            if not kids:
                break
            path.append(kids[0])
        for i in [i for i in range(len(tree)) if i not in path] + path:
            table[int(tree.tokens[i])] = np.argsort(-logits[i], kind="stable")[:TOP_K].tolist()
    assert len(table) > 10
    for token, want in table.items():
        assert route.recycler.candidates(token)[0].tolist() == want
    route.forget()
    assert route.recycler.nbytes == 0 and route.suffix.index.indexed_tokens == 0


# --- routing --------------------------------------------------------------------------------------


class RecordingDrafter(Drafter):
    n_vocab = 400

    def __init__(self):
        self.free = []

    def draft(self, context, spec, free=None):
        self.free.append(free)
        return DraftTree.chain(context[-1], [1] * spec.budget)


def test_router_sends_each_builder_to_its_drafter_and_hybrid_gets_the_free_tree():
    model = RecordingDrafter()
    route = DraftRouter(model, PromptLookupDrafter(400))
    context = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]  # lookup and suffix both see "1 2 3" continue two ways
    suffix = route.draft(context, DraftSpec("suffix", 4))
    assert sorted(int(suffix.tokens[c]) for c in suffix.children(0)) == [8, 9]
    assert len(route.draft(context, DraftSpec("recycle", 4))) == 1  # nothing learned yet
    route.draft(context, DraftSpec("hybrid", 5))
    free = model.free[-1]
    assert free is not None and 1 < len(free) <= 6 and sorted(int(free.tokens[c]) for c in free.children(0)) == [8, 9]
    alone = DraftRouter(None, PromptLookupDrafter(400)).draft(context, DraftSpec("hybrid", 5))  # no model: the free tree
    assert alone.tokens.tolist() == free.tokens.tolist() and alone.parents.tolist() == free.parents.tolist()
    route.draft(context, DraftSpec("chain", 2))
    assert model.free[-1] is None


def test_router_shows_every_context_to_the_suffix_history():
    model = RecordingDrafter()
    route = DraftRouter(model, PromptLookupDrafter(400))
    answer = [50, 51, 52, 53, 54]
    route.draft([7, 8, 9], DraftSpec("chain", 2))  # rounds drafted by the model ...
    route.draft([7, 8, 9] + answer, DraftSpec("chain", 2))
    tree = route.draft([1, 50, 51], DraftSpec("suffix", 3))  # ... still taught the suffix index
    assert tree.tokens.tolist() == [51, 52, 53, 54]


def test_cli_specs_for_the_new_builders():
    for builder in ("suffix", "recycle", "hybrid"):
        assert make_spec(builder, None, False, Sampling()) == DraftSpec(builder, DEFAULT_BUDGET[builder])
        assert make_spec(builder, 3, False, Sampling()).budget == 3


# --- the real pair: an agent-like conversation, the llama.cpp target ----------------------------------


@pytest.mark.real
def test_hybrid_and_suffix_equal_the_target_alone_on_an_agent_turn_real(real_pair, capsys):
    """The agent set's third turn (the code of two earlier answers in the context), 64 tokens, on the
    same engine: suffix @6, then hybrid @16 with the 0.5B drafter. Where an answer differs from the
    target alone's, every token from there on must be the target's own argmax after its prefix unless
    the margin is below this machine's batch noise for passes of that size (eval/numerics.py)."""
    from ondevice.eval.numerics import greedy_misses, pass_noise
    from ondevice.bench.prompt_sets import AGENT_EVAL
    from ondevice.prompt.tokenizer import Tokenizer
    from ondevice.targets.llama_target import LlamaTarget

    tokenizer = Tokenizer(real_pair.target)
    target = LlamaTarget(real_pair.target, n_ctx=2048, threads=2)
    drafter = LlamaDrafter(real_pair.drafter, n_ctx=2048, threads=2)
    prompt = tokenizer.encode_chat(AGENT_EVAL[2])
    alone, base = decode(SpecEngine(target, None, tokenizer.is_end), prompt, 64)
    engine = SpecEngine(target, router(target, drafter), tokenizer.is_end)
    for spec in (DraftSpec("suffix", 6), DraftSpec("hybrid", 16)):
        out, stats = decode(engine, prompt, 64, spec)
        with capsys.disabled():
            print(f"\n[{spec.builder} @{spec.budget} real] {stats.tokens_per_pass:.2f} tokens/pass, {stats.tokens_per_second:.1f} tok/s "
                  f"vs {base.tokens_per_second:.1f} alone; identical: {out == alone}")
        assert stats.tokens_per_pass > 1.5  # the answer re-emits the module in its context
        if out != alone:
            i = next((k for k, (a, b) in enumerate(zip(out, alone)) if a != b), min(len(out), len(alone)))
            noise = pass_noise(target, prompt, alone, [spec.budget + 1])
            ends = tokenizer.end_ids() if stats.finish_reason == "stop" else None  # where it stopped, too
            near_ties, misses = greedy_misses(target, prompt + out[:i], out[i:], noise, ends)
            with capsys.disabled():
                print(f"[{spec.builder} real] batch noise {noise:.3f}; first difference at {i}, near-ties at {near_ties}")
            assert not misses, (misses, noise)
