"""The target alone and the default (`--tree auto`) in turn, in one loaded pipeline: per row and round,
tok/s, the median pass of one token and of more, and the MB read from disk per pass.

    python -m ondevice.eval.lowmem --cgroup 1.2GB -- python scripts/interleaved_rows.py heldout23-chat --rounds 4

`ondevice bench --rounds N` loads the pair again for every round and keeps each row's fastest round;
this keeps one load (the page cache as a session leaves it) and prints every round, one JSON line
each, so a row that is slower shows whether its passes are (the median pass) or its rounds
(tokens per pass, the rounds' arms).
"""

from __future__ import annotations

import argparse
import json
import statistics

from ondevice.bench import prompt_sets
from ondevice.bench.runner import forget_session
from ondevice.cli.decoding import load_pipeline
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.stats import Stats
from ondevice.decode.verify import Sampling
from ondevice.loading.options import Answers, LoadOptions


def run_row(pipe, ids: list[list[int]], spec: DraftSpec | None, max_tokens: int) -> dict:
    forget_session(pipe.engine)  # free drafters that know nothing of the last row's answers, as bench starts a row
    totals = Stats()  # every answer's counts and per-pass lists, added up
    for prompt in ids:
        pipe.engine.cached = []  # each prompt from a cold cache, as bench runs them
        for record in pipe.stream_tokens(prompt, max_tokens=max_tokens, sampling=Sampling(), spec=spec):
            if record.stats is not None:
                totals.add(record.stats)
    by_size: dict[int, list] = {}
    for (n, s), a in zip(totals.pass_seconds, totals.accepted_per_pass):
        by_size.setdefault(n, []).append((s, a))
    sizes = {n: [len(v), round(statistics.median(s for s, _ in v), 3), round(sum(a for _, a in v) / len(v), 2)] for n, v in sorted(by_size.items())}
    one = [s for n, s in totals.pass_seconds if n == 1]
    more = [s for n, s in totals.pass_seconds if n > 1]
    return {"tokens_per_second": totals.tokens_per_second, "tokens_per_pass": totals.tokens_per_pass,
            "mb_read_per_pass": (totals.bytes_read_per_pass or 0) / 1e6,
            "median_pass_1": statistics.median(one) if one else None, "passes_1": len(one),
            "median_pass_more": statistics.median(more) if more else None, "passes_more": len(more),
            "rounds": totals.rounds_by_config, "by_size": sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", help="a prompt set (ondevice bench --prompts)")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    texts = prompt_sets.SETS[args.prompts][: args.limit]
    pipe = load_pipeline(LoadOptions(), answers=Answers(tuple(texts), args.max_tokens))
    print(json.dumps({"placement": pipe.placement_line()}), flush=True)
    ids = [pipe.encode_chat(prompt_sets.messages(t)) for t in texts]
    for round_no in range(args.rounds):
        for name, spec in (("target", None), ("auto", DraftSpec("auto", 0))):
            print(json.dumps({"round": round_no, "row": name, **run_row(pipe, ids, spec, args.max_tokens)}), flush=True)
    pipe.close()


if __name__ == "__main__":
    main()
