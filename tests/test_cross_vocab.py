"""A drafter of another tokenizer (draft/cross_vocab.py): the shared-token map, the text bridge, and the
target alone's answers, greedy and sampled, whatever the drafter proposes.

Tiny models written here (tests/tiny_models.py, tests/tiny_foreign.py): a byte-level BPE target and
two drafters of other vocabularies with the target's weights plus noise — a shuffled BPE (every id
moved, 13 of the target's tokens missing, 10 of its own) and a SentencePiece one (Gemma's kind:
"▁", byte-fallback tokens). The reference is the target alone: its greedy tokens, and for sampling
its exact distribution of the first two tokens (chi-square), with a mutant that must fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from tiny_foreign import sentencepiece, shuffled_bpe
from tiny_models import write_tiny_gguf

from ondevice.draft import vocab_map as vocab_map_mod
from ondevice.draft.cross_vocab import CrossVocabDrafter
from ondevice.draft.text_bridge import TextBridge
from ondevice.draft.vocab_map import VocabMap
from ondevice.errors import OndeviceError
from ondevice.pipeline import load
from ondevice.decode.protocols import DraftSpec
from ondevice.prompt.tokenizer import Tokenizer, vocab_mismatch
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling, target_probs

VOCAB = 320
PROMPT = "the cat sat on the abacus and the bat ate a cab; "
FOREIGN = ("shuffled", "sentencepiece")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("foreign")
    return {
        "target": write_tiny_gguf(folder / "target.gguf", "qwen2", vocab=VOCAB, seed=1),
        "shuffled": write_tiny_gguf(folder / "shuffled.gguf", "qwen2", vocab=VOCAB, seed=1, noise=0.3, vocab_edit=shuffled_bpe()),
        "sentencepiece": write_tiny_gguf(folder / "spm.gguf", "qwen2", vocab=VOCAB, seed=1, noise=0.3, vocab_edit=sentencepiece()),
        # a separate LM head (Llama): spread-out next tokens (Qwen2's tied head repeats the last token), for sampling
        "flat-target": write_tiny_gguf(folder / "flat-target.gguf", "llama", vocab=VOCAB, seed=1),
        "flat-sentencepiece": write_tiny_gguf(folder / "flat-spm.gguf", "llama", vocab=VOCAB, seed=1, noise=0.3, vocab_edit=sentencepiece()),
    }


def test_the_map_pairs_every_shared_text_once(tiny):
    target = Tokenizer(tiny["target"])
    # what each was built with: the 256 bytes and the letter pairs both hold (the shuffled one lacks 13)
    for name, shared in (("shuffled", 256 + 63 - 13), ("sentencepiece", 256 + 63)):
        drafter = Tokenizer(tiny[name])
        assert vocab_mismatch(target, drafter) is not None
        found = VocabMap.build(target, drafter)
        assert len(found.drafter_ids) == shared
        assert len(set(found.target_ids.tolist())) == shared  # one-to-one
        assert all(drafter.piece(int(d)) == target.piece(int(t)) for d, t in zip(found.drafter_ids, found.target_ids))


def test_the_map_is_saved_once_and_rebuilt_when_a_file_changes(tiny, tmp_path):
    target, drafter = Tokenizer(tiny["target"]), Tokenizer(tiny["shuffled"])
    path, _ = vocab_map_mod.map_path(target.path, drafter.path)
    path.unlink(missing_ok=True)
    said = []
    first = VocabMap.load(target, drafter, said.append)
    assert path.exists() and len(said) == 1
    again = VocabMap.load(target, drafter, said.append)
    assert len(said) == 1 and np.array_equal(first.drafter_ids, again.drafter_ids) and np.array_equal(first.target_ids, again.target_ids)
    path.write_text('{"version": 1, "key": "x"}')  # another pair's (or an old) map: built again
    VocabMap.load(target, drafter, said.append)
    assert len(said) == 2


@pytest.mark.parametrize("name", FOREIGN)
def test_the_bridge_gives_the_drafter_the_same_text(tiny, name):
    target, drafter = Tokenizer(tiny["target"]), Tokenizer(tiny[name])
    bridge = TextBridge(target, drafter)
    rng = np.random.default_rng(0)
    text = target.encode(PROMPT * 10)
    context, pos = list(text[:5]), 5
    for step in range(80):  # grow, roll back (a rejected draft), split a character across tokens, a stray byte
        if step % 7 == 3:
            context = context[: max(1, len(context) - int(rng.integers(1, 6)))]
        elif step % 11 == 5:
            context.append(0xC3)  # the first byte of "é": the text ends inside a character
        elif step % 13 == 8:
            context.append(0x80)  # a byte that is not UTF-8 here
        else:
            context += text[pos : pos + int(rng.integers(1, 5))] if context[-1] != 0xC3 or step % 2 else [0xA9]
            pos += 4
        ids = bridge.convert(context)
        if context[-1] == 0xC3:
            assert ids is None
            continue
        data = b"".join(target.piece(t) for t in context).decode("utf-8", "replace").encode()  # U+FFFD for stray bytes
        assert b"".join(drafter.piece(t) for t in ids) == data


def load_pair(tiny, name: str, target: str = "target"):
    return load(target=str(tiny[target]), drafter=str(tiny[name]), target_backend="llama", ctx=256, threads=1)


def target_alone(tiny, ids, n):
    alone = load(target=str(tiny["target"]), draft=False, target_backend="llama", ctx=256, threads=1)
    return [t for r in alone.stream_tokens(ids, max_tokens=n, spec=None) for t in r.token_ids]


@pytest.mark.parametrize("name", FOREIGN)
@pytest.mark.parametrize("mode", ["tli", "slem"])
@pytest.mark.parametrize("tree", ["chain", "best-first", "hybrid"])
def test_greedy_answer_is_the_target_alone(tiny, name, mode, tree):
    pipe = load_pair(tiny, name)
    drafter = pipe.engine.drafter.model
    assert isinstance(drafter, CrossVocabDrafter)
    drafter.mode = mode
    ids = pipe.encode_prompt(PROMPT)
    records = list(pipe.stream_tokens(ids, max_tokens=40, spec=DraftSpec(tree, budget=8)))
    assert [t for r in records for t in r.token_ids] == target_alone(tiny, ids, 40)
    assert records[-1].stats.tokens_per_pass > 3  # the drafts are read in the target's ids: most are accepted


def test_the_planner_runs_a_foreign_drafter_as_any_other(tiny):
    pipe = load_pair(tiny, "sentencepiece")
    ids = pipe.encode_prompt(PROMPT)
    records = list(pipe.stream_tokens(ids, max_tokens=40, spec=DraftSpec("auto", budget=0)))
    assert pipe.plan is not None
    assert [t for r in records for t in r.token_ids] == target_alone(tiny, ids, 40)


# --- sampling: the first two tokens follow the target alone's distribution ------------------------

SAMPLING = dict(temperature=1.0, top_k=4)  # 16 (x1, x2) pairs, each 4-30% likely here
N = 3000


def exact_first_two(pipe, ids) -> dict[tuple[int, int], float]:
    """The target alone's p(x1, x2), from its own logits (one token per pass)."""
    target = pipe.engine.target

    def probs(context):
        target.truncate(0)
        target.prefill(context[:-1])
        row = target.forward_tree(DraftTree.root_only(context[-1]))[0]
        target.commit([0])
        return target_probs(row, Sampling(**SAMPLING))

    p1 = probs(ids)
    joint = {}
    for a in np.flatnonzero(p1):
        if pipe.tokenizer.is_end(int(a)):  # the answer ends there
            joint[(int(a),)] = p1[a]
            continue
        p2 = probs(ids + [int(a)])
        joint.update({(int(a), int(b)): p1[a] * p2[b] for b in np.flatnonzero(p2)})
    pipe.engine.cached = []  # the engine prefills again
    return joint


def sampled_first_two(pipe, ids, rule: str, sample_children: bool, n: int) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for seed in range(n):
        spec = DraftSpec("best-first", budget=6, temperature=1.0, sample_children=sample_children, seed=seed)
        out = [t for r in pipe.stream_tokens(ids, max_tokens=2, sampling=Sampling(seed=seed, **SAMPLING), spec=spec, rule=rule)
               for t in r.token_ids]
        key = tuple(out) + (pipe.tokenizer.eos_id,) if len(out) < 2 else tuple(out)  # an end token is not emitted
        key = key[:1] if len(out) == 0 else key
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi2_pvalue(counts: dict, expected: dict) -> float:
    if set(counts) - set(expected):
        return 0.0  # a pair the target never samples
    keys = sorted(expected)
    obs, exp = np.array([counts.get(k, 0) for k in keys], float), np.array([expected[k] for k in keys]) * sum(counts.values())
    keep = exp >= 5
    obs, exp = np.append(obs[keep], obs[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("rule, sample_children", [("sequoia", True), ("specexec", False)])
def test_sampled_answers_follow_the_target_alone(tiny, rule, sample_children):
    pipe = load_pair(tiny, "flat-sentencepiece", "flat-target")
    ids = pipe.encode_prompt(PROMPT)
    expected = exact_first_two(pipe, ids)
    counts = sampled_first_two(pipe, ids, rule, sample_children, N)
    assert chi2_pvalue(counts, expected) > 1e-3


def test_a_q_left_in_drafter_ids_is_caught(tiny, monkeypatch):
    """Mutant: Sequoia's rule given the drafter's q unmoved (drafter ids read as target ids) must fail."""
    def unmoved(self, tree, root_token, to_target):
        out = moved(self, tree, root_token, to_target)
        for node in out.q:
            row = np.zeros(self.n_target)
            n = min(self.n_target, self.n_drafter)
            row[:n] = tree.q[node][:n]
            out.q[node] = row / row.sum() if row.sum() > 0 else out.q[node]
        return out

    moved = VocabMap.tree_to_target
    monkeypatch.setattr(VocabMap, "tree_to_target", unmoved)
    pipe = load_pair(tiny, "flat-sentencepiece", "flat-target")
    ids = pipe.encode_prompt(PROMPT)
    expected = exact_first_two(pipe, ids)
    counts = sampled_first_two(pipe, ids, "sequoia", True, 1500)
    assert chi2_pvalue(counts, expected) < 1e-6


# --- what a foreign drafter can hold: one-line errors ---------------------------------------------

def test_a_drafter_sharing_too_few_tokens_is_refused_in_one_line():
    none = VocabMap(np.zeros(0, np.int64), np.zeros(0, np.int64), 1000, 2000)
    with pytest.raises(OndeviceError, match="share no token text") as caught:
        none.check("d.gguf", "t.gguf", 1990)
    assert "\n" not in str(caught.value)
    few = VocabMap(np.arange(50), np.arange(50), 1000, 2000)
    with pytest.raises(OndeviceError, match="shares only 50 of the target t.gguf's 1,990 tokens"):
        few.check("d.gguf", "t.gguf", 1990)
    VocabMap(np.arange(100), np.arange(100), 1000, 2000).check("d.gguf", "t.gguf", 1990)  # 5%: enough


def test_a_drafter_with_a_huge_vocabulary_is_refused_in_one_line(tiny, monkeypatch):
    monkeypatch.setattr(vocab_map_mod, "MAX_FOREIGN_VOCAB", 400)  # the SentencePiece drafter lists 417
    with pytest.raises(OndeviceError, match=r"lists 417 token ids; drafting across vocabularies takes at most 400") as caught:
        load_pair(tiny, "sentencepiece")
    assert "\n" not in str(caught.value)
