"""How sure the drafter is against how often the target agrees: teacher forcing on the target's answers.

    python scripts/step_temperature.py [--target PATH] [--drafter PATH] [--prompts calibration] [-n 64]

For each prompt set: the target alone's greedy answer (llama-cpp-python's `Llama`, nothing of
ondevice's decoding), then the drafter run over prompt + answer in one pass. At every answer position
the drafter's 8 most likely tokens and whether the target's token is one of them. Prints, by bin of
the drafter's stated probability, how often its top token (and, apart, its other ranked tokens) was
the target's, and the temperature at which its ranked probabilities are most likely (the 8 tokens
and "any other" as outcomes): below 1, the drafter is less sure than the target's choices bear out.
A best-first search ranking at that temperature was measured and not adopted
(docs/measurements/2026-12-06-step-temperature.md).
"""

from __future__ import annotations

import argparse

import numpy as np
from llama_cpp import Llama

from ondevice.bench.prompt_sets import SETS, messages
from ondevice.paths import models_dir
from ondevice.prompt.tokenizer import Tokenizer

TOP = 8
GRID = np.round(np.arange(0.4, 1.51, 0.05), 2)  # the temperatures weighed
RARE = 1e-6  # the least mass "any other token" is given
BINS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.01]


def ranked_rows(target: Llama, drafter: Llama, prompt: list[int], n: int) -> list[tuple[np.ndarray, int | None]]:
    """(the drafter's top-TOP probabilities, the index among them of the target's token or None) per answer token."""
    target.reset()
    answer = []
    for token in target.generate(prompt, temp=0.0, top_k=1):
        if token == target.token_eos() or len(answer) >= n:
            break
        answer.append(token)
    drafter.reset()
    drafter.eval(prompt + answer)
    logits = np.array(drafter.scores[len(prompt) - 1 : len(prompt) - 1 + len(answer)], dtype=np.float64)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    rows = []
    for row, token in zip(probs, answer):
        top = np.argsort(-row)[:TOP]
        found = np.flatnonzero(top == token)
        rows.append((row[top], int(found[0]) if len(found) else None))
    return rows


def fitted_temperature(rows) -> float:
    """The GRID temperature of highest likelihood (the ranked tokens and "any other" as outcomes)."""
    total = np.zeros(len(GRID))
    for probs, hit in rows:
        logits = np.log(np.append(probs, max(1.0 - probs.sum(), RARE)))
        scaled = logits[None, :] / GRID[:, None]
        total += scaled[:, TOP if hit is None else hit] - np.logaddexp.reduce(scaled, axis=1)
    return float(GRID[int(np.argmax(total))])


def calibration_table(rows) -> list[str]:
    lines = []
    top1 = np.array([p[0] for p, _ in rows])
    hit1 = np.array([hit == 0 for _, hit in rows])
    others = np.concatenate([p[1:] for p, _ in rows])
    hit_others = np.concatenate([[hit == i for i in range(1, TOP)] for _, hit in rows])
    for name, stated, right in (("top token", top1, hit1), ("ranks 2-8", others, hit_others)):
        for lo, hi in zip(BINS, BINS[1:]):
            inside = (stated >= lo) & (stated < hi)
            if inside.sum() >= 5:
                lines.append(f"  {name:10} [{lo:.2f}, {hi:.2f})  n={inside.sum():5d}  stated {stated[inside].mean():.2f}  target's {right[inside].mean():.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=str(models_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--drafter", default=str(models_dir() / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--prompts", default="calibration", help="comma-separated --prompts names of ondevice bench")
    ap.add_argument("-n", type=int, default=64, help="answer tokens per prompt")
    args = ap.parse_args()
    tokenizer = Tokenizer(args.target)
    target = Llama(args.target, n_ctx=2048, n_threads=2, verbose=False)
    drafter = Llama(args.drafter, n_ctx=2048, n_threads=2, logits_all=True, verbose=False)
    every = []
    for name in args.prompts.split(","):
        rows = [r for text in SETS[name] for r in ranked_rows(target, drafter, tokenizer.encode_chat(messages(text)), args.n)]
        every += rows
        print(f"{name}: {len(rows)} rows, the target's token the drafter's top {np.mean([h == 0 for _, h in rows]):.3f}, "
              f"fitted temperature {fitted_temperature(rows):.2f}")
        print("\n".join(calibration_table(rows)))
    print(f"all: {len(every)} rows, fitted temperature {fitted_temperature(every):.2f}")


if __name__ == "__main__":
    main()
