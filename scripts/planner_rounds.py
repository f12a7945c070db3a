"""The default (`--tree auto`) round by round: each round's arm, the nodes its pass verified, the
tokens it emitted, the pass and round seconds; per answer, tok/s and rounds by arm. One JSON line each.

    ONDEVICE_HOME=H python -m ondevice.eval.lowmem --cgroup 0.9GB -- python scripts/planner_rounds.py heldout25-code

Shows which trees the planner ran when, and what a round cost that a bench row's totals hide (an
answer's first round, a tree tried once). `--estimates` adds, after each round, the arms the next
round chooses from, best first: the estimate (tok/s), the cost model's prediction, its predicted
tokens a pass, the family's κ (measured / predicted) and the tokens the arm measured.
"""

from __future__ import annotations

import argparse
import json

from ondevice.bench import prompt_sets
from ondevice.cli.decoding import load_pipeline
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.verify import Sampling
from ondevice.loading.options import Answers, LoadOptions
from ondevice.plan.arms import arm_of, family_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", help="a prompt set (ondevice bench --prompts)")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--estimates", action="store_true", help="the arms' estimates after each round")
    args = parser.parse_args()
    texts = prompt_sets.SETS[args.prompts][: args.limit]
    pipe = load_pipeline(LoadOptions(), answers=Answers(tuple(texts), args.max_tokens))
    print(json.dumps({"placement": pipe.placement_line()}), flush=True)
    planner = pipe.auto_planner()
    learn = planner.observe

    def observe(report) -> None:
        line = {"arm": arm_of(report.spec), "nodes": len(report.tree), "emitted": len(report.path),
                "pass_seconds": round(report.pass_seconds, 3), "round_seconds": round(report.round_seconds, 3)}
        learn(report)
        if args.estimates:
            line["estimates"] = [estimate(planner, arm, spt) for arm, spt in planner.book.leading(planner.prices)[:4]]
        print(json.dumps(line), flush=True)

    planner.observe = observe  # what the pipeline hands the engine for every planned round
    for answer, text in enumerate(texts):
        pipe.engine.cached = []  # each prompt from a cold cache, as bench runs them
        for record in pipe.stream_tokens(pipe.encode_chat(prompt_sets.messages(text)), max_tokens=args.max_tokens,
                                         sampling=Sampling(), spec=DraftSpec("auto", 0)):
            if record.stats is not None:
                print(json.dumps({"answer": answer, "tokens_per_second": round(record.stats.tokens_per_second, 2),
                                  "rounds": record.stats.rounds_by_config}), flush=True)
    pipe.close()


def estimate(planner, arm: str, spt: float) -> dict:
    """What the planner believes of an arm: its estimate, prediction, predicted tokens a pass, κ, measured tokens."""
    price, tally = planner.prices[arm], planner.book.arms.get(arm)
    return {"arm": arm, "estimate": round(1 / spt, 2), "predicted": round(1 / price.spt, 2) if price.spt else None,
            "predicted_tokens_per_pass": round(price.tokens_per_round, 2) if price.tokens_per_round else None,
            "kappa": round(planner.book.kappa(family_of(arm)), 2), "measured_tokens": round(tally.tokens, 1) if tally else 0}


if __name__ == "__main__":
    main()
