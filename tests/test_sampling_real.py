"""Exact sampling with the real pair: a tree from the real 0.5B drafter (VocabTrim head included),
real 1.5B target logits (the fp32 torch target: its batch noise is ≤ 1e-4, so a tree pass and a
single-token pass give the same distributions), and the product's verifiers; the reference is the
target alone, one token per pass.

- SpecExec rule, first two tokens: one tree drafted by the real drafter (the rule is exact for any
  fixed tree); when a pass emits only one token, the second comes from a root-only next pass, as
  the engine would produce it. 8k samples, chi-square against the target's own joint distribution.
- Sequoia rule, first token: the rule is exact only over the drafter's random draws, so the root's
  children are drawn afresh for every sample from the real drafter's q (the drafter's own
  without-replacement sampler).
- Power: a mutant that accepts the first drafted child unconditionally must fail (p < 1e-6).

Not the llama.cpp target: its batched logits differ from single-token logits by up to ~0.5
(measured on this pair), which 8k samples detect; there sampled output follows the batched pass.
"""

from __future__ import annotations


import numpy as np
import pytest
from scipy import stats

import ondevice.decode.verify as verify_mod
from ondevice.draft.search_tree import sampled_children
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling, Verdict, target_probs, verify

pytestmark = pytest.mark.real

N = 8_000
SAMPLING = Sampling(temperature=1.0, top_k=6)
PROMPT = "Pick a random number from 1 to 10. Reply with the number only."  # a spread-out first token


@pytest.fixture(scope="module")
def setup(real_pair):
    from ondevice.draft.llama_drafter import LlamaDrafter
    from ondevice.targets.torch_target import TorchTarget
    from ondevice.prompt.tokenizer import Tokenizer

    tok = Tokenizer(real_pair.target)
    ids = tok.encode_user(PROMPT)
    drafter = LlamaDrafter(real_pair.drafter, n_ctx=512, threads=2, vocab_trim=True)
    target = TorchTarget.from_gguf(real_pair.target, device="cpu", n_ctx=512, threads=2)
    return ids, drafter, target


def target_rows(target, ids: list[int], tree: DraftTree | None = None) -> np.ndarray:
    """Logits after `ids` (+ the tree's nodes, one row each), from a fresh cache."""
    target.truncate(0)
    target.prefill(ids[:-1])
    logits = target.forward_tree(tree if tree is not None else DraftTree.root_only(ids[-1]))
    target.commit([0])
    return logits


@pytest.fixture(scope="module")
def reference(setup):
    """The target alone: p(x1) and p(x2 | x1) for every x1 it can sample (top-k cut)."""
    ids, _, target = setup
    p1 = target_probs(target_rows(target, ids)[0], SAMPLING)
    support = np.flatnonzero(p1)
    p2 = {int(x): target_probs(target_rows(target, ids + [int(x)])[0], SAMPLING) for x in support}
    return p1, p2


def memoized_probs(monkeypatch) -> None:
    """target_probs is pure; caching it per row keeps 8k verifications over a 152k vocabulary fast."""
    cache: dict[tuple[int, bytes], np.ndarray] = {}

    def probs(row, sampling):
        key = (id(row), row[:16].tobytes())
        if key not in cache:
            cache[key] = target_probs(row, sampling)
        return cache[key]

    monkeypatch.setattr(verify_mod, "target_probs", probs)


def first_two_specexec(setup, reference, verifier, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ids, drafter, target = setup
    p1, p2 = reference
    tree = drafter.draft(ids, DraftSpec("best-first", 6, temperature=SAMPLING.temperature))
    assert 2 <= len(tree) <= 7
    rows = target_rows(target, ids, tree)
    rows = [rows[i] for i in range(len(tree))]  # stable row objects for the memo
    support = np.flatnonzero(p1)
    pair_index = {(int(a), int(b)): i for i, (a, b) in enumerate((a, b) for a in support for b in np.flatnonzero(p2[int(a)]))}
    counts = np.zeros(len(pair_index))
    rng = np.random.default_rng(seed)
    for _ in range(n):
        tokens = verifier(tree, rows, SAMPLING, rng).tokens
        if len(tokens) < 2:  # next pass: root-only tree at x1, the target samples x2
            q = p2[tokens[0]]
            tokens = [tokens[0], int(rng.choice(len(q), p=q))]
        counts[pair_index[(tokens[0], tokens[1])]] += 1
    expected = np.array([p1[a] * p2[a][b] for (a, b) in pair_index])
    return counts, expected


def chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    keep = expected_p * counts.sum() >= 5  # chi-square needs enough expected counts per cell
    rest = counts[~keep].sum(), expected_p[~keep].sum()
    obs = np.append(counts[keep], rest[0])
    exp = np.append(expected_p[keep], rest[1]) * counts.sum()
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def specexec(tree, rows, sampling, rng):
    return verify(tree, rows, sampling, rng, "specexec")


def accept_first_child(tree, rows, sampling, rng) -> Verdict:
    """Mutant: accept the first drafted child at every node without any test."""
    path = [0]
    while tree.children(path[-1]):
        path.append(tree.children(path[-1])[0])
    x = int(rng.choice(len(rows[path[-1]]), p=verify_mod.target_probs(rows[path[-1]], sampling)))
    return Verdict(path, [int(t) for t in tree.tokens[path[1:]]] + [x])


def test_specexec_rule_with_real_drafter_matches_target(setup, reference, monkeypatch):
    memoized_probs(monkeypatch)
    counts, expected = first_two_specexec(setup, reference, specexec, N, seed=1)
    assert chi2_pvalue(counts, expected) > 1e-3


def test_mutant_is_caught_with_real_drafter(setup, reference, monkeypatch):
    memoized_probs(monkeypatch)
    counts, expected = first_two_specexec(setup, reference, accept_first_child, 2_000, seed=2)
    assert chi2_pvalue(counts, expected) < 1e-6


@pytest.mark.parametrize("verifier,passes", [("sequoia", True), ("mutant", False)])
def test_sequoia_rule_with_real_drafter_q(setup, reference, monkeypatch, verifier, passes):
    """First token under Sequoia's rule: root children redrawn from the real drafter's q each time."""
    memoized_probs(monkeypatch)
    ids, drafter, _ = setup
    p1, _ = reference
    tree = drafter.draft(ids, DraftSpec("best-first", 6, temperature=SAMPLING.temperature, sample_children=True))
    q0 = tree.q[0].astype(np.float64)
    assert q0.sum() == pytest.approx(1.0, abs=1e-4)
    row = target_rows(setup[2], ids)[0]
    logq = np.log(np.where(q0 > 0, q0, 1e-300)).astype(np.float32)
    logq[q0 == 0] = -np.inf
    rng = np.random.default_rng(3)
    n = N if passes else 2_000
    counts = np.zeros(len(p1))
    for _ in range(n):
        kids, _ = sampled_children(logq, 3, rng)
        t = DraftTree(np.array([ids[-1], *kids]), np.array([-1, 0, 0, 0][: 1 + len(kids)]), np.zeros(1 + len(kids)), q={0: q0})
        rows = [row] * len(t)  # only the first token is counted: rows below the root are not read for it
        v = verify(t, rows, SAMPLING, rng, "sequoia") if passes else accept_first_child(t, rows, SAMPLING, rng)
        counts[v.tokens[0]] += 1
    support = np.flatnonzero(p1)
    outside = counts.sum() - counts[support].sum()  # tokens the target never samples (top-k cut)
    p = chi2_pvalue(counts[support], p1[support]) if outside == 0 else 0.0  # any such token: impossible under P
    assert (p > 1e-3) if passes else (p < 1e-6)
