"""Sequoia's children drawn without replacement (Gumbel top-k) from a row with tokens of
probability 0 (a trimmed vocabulary, a top-k cut): the law of the first two draws held to the exact
one by a chi-square test, and no token of probability 0 ever drawn."""

from __future__ import annotations

import numpy as np
from scipy import stats

from ondevice.draft.search_tree import sampled_children


def test_draws_follow_sampling_without_replacement_and_skip_impossible_tokens():
    rng = np.random.default_rng(0)
    p = np.zeros(1000)
    support = np.array([3, 17, 400, 401, 999])
    p[support] = [0.4, 0.25, 0.2, 0.1, 0.05]
    logp = np.full(1000, -np.inf, dtype=np.float32)
    logp[support] = np.log(p[support])
    pairs = {(a, b): p[a] * p[b] / (1 - p[a]) for a in support for b in support if a != b}  # exact law of (1st, 2nd)
    index = {pair: i for i, pair in enumerate(pairs)}
    counts = np.zeros(len(pairs))
    for _ in range(20_000):
        tokens, steps = sampled_children(logp, 2, rng)
        assert set(tokens) <= set(support) and len(tokens) == 2
        assert np.array_equal(steps, logp[tokens])
        counts[index[(int(tokens[0]), int(tokens[1]))]] += 1
    expected = np.array(list(pairs.values())) * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    wrong = np.array(list(pairs.values()))[::-1]  # the test can fail: a different law is rejected
    assert stats.chisquare(counts, wrong / wrong.sum() * counts.sum()).pvalue < 1e-6


def test_more_children_than_possible_tokens_gives_each_once():
    logp = np.full(50, -np.inf, dtype=np.float32)
    logp[[5, 9]] = np.log([0.7, 0.3])
    tokens, _ = sampled_children(logp, 4, np.random.default_rng(1))
    assert sorted(tokens.tolist()) == [5, 9]
