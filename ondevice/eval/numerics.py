"""How much a target's logits depend on batch size ("batch noise"), and the margins it threatens.

Verifying n drafted tokens in one pass runs other kernels than decoding them one at a time, so the
logits differ slightly. Greedy decoding stays exact as long as that difference never flips an
argmax, i.e. wherever the target's top-1/top-2 margin exceeds the noise. `measure_batch_noise`
measures the noise of any `ondevice.decode.protocols.Target`; tests and benchmarks compare divergences
against it (DESIGN.md, "Exactness and numerics").
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from ondevice.decode.protocols import Target
from ondevice.decode.reference import greedy_reference
from ondevice.decode.tree import DraftTree


def top2_margin(logits_row: np.ndarray) -> float:
    """Top-1 minus top-2 logit of one (vocab,) row: how far greedy decoding is from a tie."""
    top2 = np.partition(np.asarray(logits_row, dtype=np.float64), -2)[-2:]
    return float(top2[1] - top2[0])


def logits_one_by_one(target: Target, tokens: Sequence[int]) -> np.ndarray:
    """(n, vocab) logits of tokens fed as n one-node trees, each committed before the next."""
    rows = []
    for token in tokens:
        rows.append(np.array(target.forward_tree(DraftTree.root_only(int(token)))[0]))  # a target may lend its buffer
        target.commit([0])
    return np.stack(rows)


def logits_as_chain(target: Target, tokens: Sequence[int]) -> np.ndarray:
    """(n, vocab) logits of tokens fed as one chain tree (one pass), then committed."""
    logits = target.forward_tree(DraftTree.chain(int(tokens[0]), [int(t) for t in tokens[1:]]))
    target.commit(list(range(len(tokens))))
    return logits


def noise_stats(single: np.ndarray, batched: np.ndarray) -> dict:
    """How far `batched` logits are from `single` ones, both (n, vocab), same tokens and context.

    The margin change is measured on the single run's top-2 tokens (a, b):
    Δgap = (batched[a] - batched[b]) - (single[a] - single[b]); an argmax flips only where
    |Δgap| exceeds the margin.
    """
    single, batched = single.astype(np.float64), batched.astype(np.float64)
    rows = np.arange(len(single))
    top2 = np.argsort(single, axis=1)[:, -2:]  # (n, 2): [second, first]
    a, b = top2[:, 1], top2[:, 0]
    gap_single = single[rows, a] - single[rows, b]
    gap_delta = np.abs((batched[rows, a] - batched[rows, b]) - gap_single)
    return {
        "n_tokens": len(single),
        "max_gap_delta": float(gap_delta.max()),
        "p95_gap_delta": float(np.percentile(gap_delta, 95)),
        "max_logit_delta": float(np.abs(batched - single).max()),
        "argmax_flips": int(np.sum(batched.argmax(1) != single.argmax(1))),
        "min_margin": float(gap_single.min()),
    }


def measure_batch_noise(target: Target, tokens: Sequence[int]) -> dict:
    """Compare `tokens` fed one at a time with the same tokens as one chain tree (`noise_stats`).

    The cache must hold the context before tokens[0] (tokens[0] is the next, unseen token); it is
    left as it was.
    """
    return batch_noise_by_size(target, tokens, [len(tokens)])[len(tokens)]


def batch_noise_by_size(
    target: Target, tokens: Sequence[int], sizes: Sequence[int], single: np.ndarray | None = None
) -> dict[int, dict]:
    """For each pass size n: `tokens` fed as consecutive chains of n (the last one shorter) against
    the same tokens one at a time. Same cache contract as `measure_batch_noise`; n = 1 measures
    run-to-run determinism (max_logit_delta 0 unless the backend is not deterministic). single: the
    one-at-a-time logits of `tokens`, (len(tokens), vocab), when already at hand (`OneTokenRows`)."""
    start = target.n_cached
    if single is None:
        single = logits_one_by_one(target, tokens)
    elif len(single) != len(tokens):
        raise ValueError(f"{len(single)} one-token rows for {len(tokens)} tokens")
    result = {}
    for n in sizes:
        target.truncate(start)
        chains = [logits_as_chain(target, tokens[i : i + n]) for i in range(0, len(tokens), n)]
        result[n] = noise_stats(single, np.concatenate(chains))
    target.truncate(start)
    return result


def pass_noise(
    target: Target, prompt: Sequence[int], continuation: Sequence[int], sizes: Sequence[int], single: np.ndarray | None = None
) -> float:
    """The batch noise that threatens passes of `sizes` tokens, measured on this machine: the largest
    top-2 gap change (max_gap_delta) when prompt[-1] + continuation is fed as chains of each size
    instead of one at a time, after prompt[:-1]. The cache is left holding prompt[:-1]. single: the
    one-at-a-time logits, if the target alone's answer already computed them (`OneTokenRows`: its
    first len(continuation) + 1 passes are exactly these)."""
    target.truncate(0)
    target.prefill(prompt[:-1])
    by_size = batch_noise_by_size(target, [prompt[-1]] + list(continuation), sizes, single)
    return max(stats["max_gap_delta"] for stats in by_size.values())


class OneTokenRows:
    """A target that keeps the logits of its first `keep` one-token passes, in order (the rest of
    the Target protocol is the wrapped target's). Decoding the target alone through it (greedy, one
    token per pass, from an empty cache) yields the reference answer and, at no extra pass, the
    one-at-a-time logits that `pass_noise` compares chains with."""

    def __init__(self, inner: Target, keep: int):
        self.inner, self.keep, self.rows = inner, keep, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward_tree(self, tree: DraftTree) -> np.ndarray:
        logits = self.inner.forward_tree(tree)
        if len(tree) == 1 and len(self.rows) < self.keep:
            self.rows.append(np.array(logits[0], copy=True))
        return logits


def greedy_misses(target: Target, prompt: Sequence[int], out: Sequence[int], noise: float,
                  end_ids: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Check a greedy answer token by token against the target alone: (near_ties, misses).

    Teacher-forced: the target, one token per pass, reads prompt + out[:j] and its argmax is compared
    with out[j]. Where they differ, the position is a near-tie if the target's top-2 margin there is
    below `noise` (the measured batch noise: batched verification may flip such an argmax), else a
    miss, which no numerics explain. end_ids (the vocabulary's end tokens): the answer stopped on one
    of them after `out` (a decode does not emit it), so position len(out) is checked too: an end
    token must be the target's argmax there or within the noise of it (else an answer that stopped
    early would pass as a prefix). The cache is left holding prompt + out[:-1] (+ out[-1] with end_ids).
    """
    target.truncate(0)
    target.prefill(prompt[:-1])
    fed = list(out) if end_ids is not None else list(out[:-1])
    logits = logits_one_by_one(target, [prompt[-1]] + fed)
    wrong = [j for j in range(len(out)) if int(logits[j].argmax()) != out[j]]
    near_ties = [j for j in wrong if top2_margin(logits[j]) < noise]
    misses = [j for j in wrong if j not in near_ties]
    if end_ids is not None:
        row, ends = logits[len(out)], [int(e) for e in end_ids]
        top = int(row.argmax())
        if top not in ends:  # no end token at all: nothing could have ended the answer there
            margin = row[top] - row[ends].max() if ends else np.inf
            (near_ties if margin < noise else misses).append(len(out))
    return near_ties, misses


# --- this machine's table: `python -m ondevice.eval.numerics [--torch]` ------------------------


def noise_by_size(target: Target, prompts: Sequence[Sequence[int]], sizes: Sequence[int], n_tokens: int = 64) -> dict[int, dict]:
    """`batch_noise_by_size` on the target's own greedy continuation of each prompt (n_tokens fed,
    the first one the prompt's last); per size, the worst over the prompts."""
    worst: dict[int, dict] = {}
    for prompt in prompts:
        tokens = [prompt[-1]] + greedy_reference(target, prompt, n_tokens - 1)
        target.truncate(len(prompt) - 1)
        for n, stats in batch_noise_by_size(target, tokens, sizes).items():
            old = worst.setdefault(n, stats)
            for key in ("max_gap_delta", "max_logit_delta", "argmax_flips"):
                old[key] = max(old[key], stats[key])
    return worst


def main() -> None:
    # Imported here: the numerics helpers above must import where llama.cpp is missing (the GPU machine).
    from ondevice.catalog.hub import ensure_pair
    from ondevice.catalog.pairs import load_pair
    from ondevice.machine.facts import machine_facts
    from ondevice.bench.prompt_sets import CHAT_EVAL, CODE_EVAL
    from ondevice.prompt.tokenizer import Tokenizer
    from ondevice.targets.llama_target import LlamaTarget

    parser = argparse.ArgumentParser(description="This machine's batch noise: logits of passes of n tokens vs one token at a time.")
    parser.add_argument("--sizes", default="2,8,64", help="pass sizes, comma-separated (at most 64)")
    parser.add_argument("--torch", action="store_true", help="also the 1.5B in our PyTorch target, fp32 (~1 min to load)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    pair, facts = ensure_pair(load_pair(None)), machine_facts()
    tokenizer = Tokenizer(pair.target)
    prompts = [tokenizer.encode_user(p) for p in (CODE_EVAL[0], CHAT_EVAL[0])]
    print(f"{facts.cpu_model}, {facts.usable_cores} cores, {' '.join(facts.simd)}; 2 threads")
    print("passes of n tokens vs one token at a time, 2 prompts x 64 greedy tokens; cells: max |Δlogit| / max Δgap / argmax flips")
    print("| model | " + " | ".join(f"n = {n}" for n in sizes) + " |\n|---|" + "---|" * len(sizes))
    runs = [("llama.cpp 1.5B", lambda: LlamaTarget(pair.target, n_ctx=512, threads=2)),
            ("llama.cpp 0.5B", lambda: LlamaTarget(pair.drafter, n_ctx=512, threads=2))]  # fmt: skip
    if args.torch:
        from ondevice.targets.torch_target import TorchTarget  # lazy: torch (~1 s) only with --torch

        runs.append(("torch fp32 1.5B", lambda: TorchTarget.from_gguf(pair.target, n_ctx=512, threads=2)))
    for name, make in runs:
        rows = noise_by_size(make(), prompts, sizes)
        cells = [f"{r['max_logit_delta']:.3g} / {r['max_gap_delta']:.3g} / {r['argmax_flips']}" for r in (rows[n] for n in sizes)]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
