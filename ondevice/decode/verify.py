"""Verification: given a draft tree and the target's logits at every node, pick the path to keep.

Every rule returns a `Verdict`: the accepted root→node path (node indices, path[0] == 0) and the
tokens to emit (the accepted drafted tokens plus one token chosen by the target after the last
accepted node). Emitted tokens are always distributed exactly as the target alone would produce
them:

- greedy: the target's argmax at each node; a child is accepted iff it equals that argmax.
- SpecExec: the target *samples* x ~ P(node) at each node on the walk; the child whose token is x
  is accepted, else x itself is the bonus token. Every emitted token is a target sample, so this
  is exact for any tree (top-k or sampled children).
- Sequoia (sampling without replacement): children were drawn without replacement from the
  drafter's Q(node). For each child x in draw order, accept with probability min(1, P[x]/Q[x]);
  on rejection P ← norm(relu(P − Q)) and x is removed from Q (Q ← norm(Q without x)). If no child
  is accepted, the bonus is sampled from the residual P.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ondevice.errors import OndeviceError
from ondevice.decode.tree import DraftTree


# What sampling takes. Below MIN_TEMPERATURE, logits / temperature overflow to inf for large logits and
# the probabilities become NaN (1e-320 did); 0 is greedy, the exact limit of a small temperature.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 100.0
MIN_TOP_P = 1e-6  # below it top-p keeps only the most likely token: say top-k 1
MAX_TOP_K = 2**31 - 1
MAX_SEED = 2**63 - 1


class BadSampling(OndeviceError):
    """A sampling value out of range; `param` names the field (a server's 400 says which)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Sampling:
    """How the target picks tokens. temperature == 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int = 0

    def __post_init__(self) -> None:
        t, p = self.temperature, self.top_p
        if not (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):  # NaN fails both
            raise BadSampling("temperature", f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} and {MAX_TEMPERATURE:g} "
                                             f"(got {_shown(t)}).")
        if not MIN_TOP_P <= p <= 1:
            raise BadSampling("top_p", f"top-p must be between {MIN_TOP_P:g} and 1 (got {_shown(p)}).")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise BadSampling("top_k", f"top-k must be between 0 and {MAX_TOP_K} (got {_shown(self.top_k)}).")
        if not 0 <= self.seed <= MAX_SEED:
            raise BadSampling("seed", f"seed must be between 0 and {MAX_SEED} (got {_shown(self.seed)}).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


@dataclass
class Verdict:
    path: list[int]  # accepted node indices, root first
    tokens: list[int]  # drafted tokens along the path (path[1:]) + the target's bonus token


def target_probs(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The target's sampling distribution for one row of logits: temperature, then top-k, then top-p."""
    z = logits.astype(np.float64) / sampling.temperature
    if sampling.top_k and sampling.top_k < len(z):
        kth = np.partition(z, -sampling.top_k)[-sampling.top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, sampling.top_p)) + 1]  # smallest set with mass >= top_p
        cut = np.zeros_like(p)
        cut[keep] = p[keep]
        p = cut / cut.sum()
    return p


def child_index(tree: DraftTree) -> dict[tuple[int, int], int]:
    """(parent node, token) → child node."""
    return {(int(tree.parents[i]), int(tree.tokens[i])): i for i in range(1, len(tree))}


def verify_greedy(tree: DraftTree, logits: np.ndarray) -> Verdict:
    choice = logits.argmax(axis=-1)  # (n,) the target's token after each node
    child = child_index(tree)
    path = [0]
    while (path[-1], int(choice[path[-1]])) in child:
        path.append(child[(path[-1], int(choice[path[-1]]))])
    return Verdict(path, [int(t) for t in tree.tokens[path[1:]]] + [int(choice[path[-1]])])


def verify_specexec(tree: DraftTree, logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> Verdict:
    child = child_index(tree)
    path = [0]
    while True:
        p = target_probs(logits[path[-1]], sampling)
        x = int(rng.choice(len(p), p=p))  # a target sample at this node
        if (path[-1], x) not in child:
            return Verdict(path, [int(t) for t in tree.tokens[path[1:]]] + [x])
        path.append(child[(path[-1], x)])


def verify_sequoia(tree: DraftTree, logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> Verdict:
    path = [0]
    while True:
        node = path[-1]
        p = target_probs(logits[node], sampling)
        kids = tree.children(node)  # in draw order (children are appended as drawn)
        accepted = None
        if kids:
            if node not in tree.q:
                raise ValueError(f"Sequoia verification needs the drafter's q at node {node}")
            q = tree.q[node].astype(np.float64).copy()
            for c in kids:
                x = int(tree.tokens[c])
                # accept x with probability min(1, P[x] / Q[x])
                if q[x] > 0 and rng.random() * q[x] < p[x]:
                    accepted = c
                    break
                p = np.maximum(p - q, 0.0)  # residual P ← norm(relu(P − Q))
                p = p / p.sum() if p.sum() > 0 else target_probs(logits[node], sampling)
                q[x] = 0.0  # Q ← norm(Q without x)
                if q.sum() <= 0:
                    break
                q /= q.sum()
        if accepted is None:
            x = int(rng.choice(len(p), p=p))
            return Verdict(path, [int(t) for t in tree.tokens[path[1:]]] + [x])
        path.append(accepted)


RULES = ("specexec", "sequoia")


def verify(tree: DraftTree, logits: np.ndarray, sampling: Sampling, rng: np.random.Generator, rule: str = "specexec") -> Verdict:
    """Dispatch on the sampling mode: greedy for temperature 0, else the named sampling rule."""
    if rule not in RULES:
        raise OndeviceError(f"unknown verification rule {rule!r}; choose one of {', '.join(RULES)}.")
    if sampling.greedy:
        return verify_greedy(tree, logits)
    if rule == "sequoia":
        return verify_sequoia(tree, logits, sampling, rng)
    return verify_specexec(tree, logits, sampling, rng)
