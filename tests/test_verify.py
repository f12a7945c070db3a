"""Verification rules against the target's own distribution (exactness), on a tiny synthetic model.

The "models" are fixed random tables: logits depend on the last two tokens, so each position has
its own distribution. The reference is computed exactly from the target table alone; speculative
decoding's empirical joint distribution of the first two tokens must match it (chi-square), and a
mutant that accepts drafts unconditionally must be caught by the same harness.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ondevice.decode.tree import DraftTree
from ondevice.decode.verify import Sampling, Verdict, target_probs, verify, verify_greedy

V = 6
SAMPLING = Sampling(temperature=0.9, top_p=0.95, top_k=5)


def table(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.5, size=(V, V, V))  # (prev2, prev1) -> logits


TARGET, DRAFT = table(1), table(2)


def probs(tab: np.ndarray, context: list[int], sampling: Sampling) -> np.ndarray:
    return target_probs(tab[context[-2], context[-1]], sampling)


def draft_tree(context: list[int], rng: np.random.Generator, width: int, depth: int, sample: bool) -> DraftTree:
    """Children of each node: `width` tokens drawn without replacement from q (or q's top-k)."""
    tokens, parents, q = [context[-1]], [-1], {}
    frontier = [(0, list(context))]
    for _ in range(depth):
        nxt = []
        for node, ctx in frontier:
            qn = probs(DRAFT, ctx, SAMPLING)
            q[node] = qn
            if sample:  # Gumbel top-k == sampling without replacement
                keys = np.log(np.maximum(qn, 1e-300)) + rng.gumbel(size=V)
                keys[qn == 0] = -np.inf
            else:
                keys = qn
            for tok in np.argsort(-keys)[:width]:
                if qn[tok] == 0:
                    continue
                tokens.append(int(tok))
                parents.append(node)
                nxt.append((len(tokens) - 1, ctx + [int(tok)]))
        frontier = nxt
    return DraftTree(np.array(tokens), np.array(parents), np.zeros(len(tokens)), q)


def tree_logits(tree: DraftTree, context: list[int]) -> np.ndarray:
    out = np.zeros((len(tree), V))
    for i in range(len(tree)):
        path_tokens = [int(tree.tokens[j]) for j in tree.path_to(i)]
        ctx = context[:-1] + path_tokens
        out[i] = TARGET[ctx[-2], ctx[-1]]
    return out


def first_two(verifier, rule: str, sample_children: bool, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros((V, V))
    for _ in range(n):
        context, out = [0, 1], []
        while len(out) < 2:
            tree = draft_tree(context, rng, width=2, depth=2, sample=sample_children)
            verdict = verifier(tree, tree_logits(tree, context), SAMPLING, rng, rule)
            out += verdict.tokens
            context += verdict.tokens
        counts[out[0], out[1]] += 1
    return counts


def exact_first_two() -> np.ndarray:
    p1 = probs(TARGET, [0, 1], SAMPLING)
    return np.array([p1[a] * probs(TARGET, [1, a], SAMPLING) for a in range(V)])


def chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """p-value of "counts were drawn from expected_p"; 0 if a pair the target cannot produce occurred."""
    mask = expected_p.ravel() > 0
    if counts.ravel()[~mask].sum() > 0:
        return 0.0
    return stats.chisquare(counts.ravel()[mask], expected_p.ravel()[mask] * counts.sum()).pvalue


def accept_first_child(tree: DraftTree, logits, sampling, rng, rule) -> Verdict:
    """Mutant: always accept the first drafted child (no acceptance test)."""
    path = [0]
    while tree.children(path[-1]):
        path.append(tree.children(path[-1])[0])
    bonus = int(rng.choice(V, p=target_probs(logits[path[-1]], sampling)))
    return Verdict(path, [int(t) for t in tree.tokens[path[1:]]] + [bonus])


N = 12000


@pytest.mark.parametrize("rule,sample_children", [("specexec", False), ("specexec", True), ("sequoia", True)])
def test_sampling_matches_target_distribution(rule, sample_children):
    counts = first_two(verify, rule, sample_children, N, seed=7)
    assert chi2_pvalue(counts, exact_first_two()) > 1e-3


def test_mutant_that_accepts_drafts_is_caught():
    counts = first_two(accept_first_child, "specexec", True, N, seed=7)
    assert chi2_pvalue(counts, exact_first_two()) < 1e-6


def test_sequoia_without_residual_update_is_caught():
    """Mutant: Sequoia acceptance test but the bonus sampled from P instead of the residual."""
    from ondevice.decode import verify as v

    def broken(tree, logits, sampling, rng, rule):
        path = [0]
        while True:
            p = target_probs(logits[path[-1]], sampling)
            kids, accepted = tree.children(path[-1]), None
            for c in kids:
                x, q = int(tree.tokens[c]), tree.q[path[-1]]
                if rng.random() * q[x] < p[x]:
                    accepted = c
                    break
            if accepted is None:
                return v.Verdict(path, [int(t) for t in tree.tokens[path[1:]]] + [int(rng.choice(V, p=p))])
            path.append(accepted)

    counts = first_two(broken, "sequoia", True, N, seed=7)
    assert chi2_pvalue(counts, exact_first_two()) < 1e-6


def test_greedy_takes_longest_matching_path():
    # root -> a(1) -> c(3); root -> b(2); target argmax: after root 1, after a 3, after c 5
    tree = DraftTree(np.array([0, 1, 2, 3]), np.array([-1, 0, 0, 1]), np.zeros(4))
    logits = np.full((4, V), -1.0)
    logits[0, 1] = logits[1, 3] = logits[3, 5] = logits[2, 4] = 1.0
    verdict = verify_greedy(tree, logits)
    assert verdict.path == [0, 1, 3] and verdict.tokens == [1, 3, 5]
    logits[0] = -1.0
    logits[0, 4] = 1.0  # target wants 4 first: nothing accepted, bonus 4
    assert verify_greedy(tree, logits).tokens == [4]


def test_bad_sampling_settings_are_user_errors():
    from ondevice.errors import OndeviceError

    for kwargs in ({"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}):
        with pytest.raises(OndeviceError):
            Sampling(**kwargs)


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLING], ids=["greedy", "sampled"])
def test_an_unknown_rule_is_refused_not_run_as_specexec(sampling):
    from ondevice.errors import OndeviceError

    tree = DraftTree.chain(0, [1, 2])
    logits = np.random.default_rng(0).normal(size=(3, V))
    with pytest.raises(OndeviceError, match="sequoya"):
        verify(tree, logits, sampling, np.random.default_rng(0), rule="sequoya")
