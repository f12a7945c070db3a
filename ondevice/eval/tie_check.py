"""Check a bench report's answers that differ from the target alone's under the near-tie rule.

    python -m ondevice.eval.tie_check REPORT.json [REPORT.json ...] [--out CHECK.json]

`ondevice bench --json` records every answer that is not token for token the target alone's
(`differing`: prompt index, answer, the target alone's). A batched pass may flip an argmax whose
top-2 margin is within this machine's batch noise, and the answer then goes on from the other
token: exact under the near-tie rule, not a bug. This loads the report's target as the run ran it
(weights mapped and not repacked where it streamed the file as it is, the same KV type), measures the batch noise on
the prompts concerned (passes of 2 to `--sizes` tokens against one token at a time), and checks each
answer token by token, teacher-forced, one token per pass (`eval.numerics.greedy_misses`): every
token must be the target's argmax or a near tie, and so must the end of an answer that stopped
before `max_tokens` (a decode does not emit the end token it stops on). A miss is a token no numerics explain. The target
alone's own answers are checked too: they show the check itself holds on this load.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ondevice.catalog.hub import local_path
from ondevice.catalog.pairs import load_pair
from ondevice.eval.numerics import greedy_misses, pass_noise
from ondevice.bench import prompt_sets
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.targets.llama_target import LlamaTarget


def open_target(path: Path, placement: dict | None, n_ctx: int, sizes: list[int], threads: int) -> LlamaTarget:
    """The target as the report's run computed it: mapped, not repacked, where it streamed the file;
    repacked by llama.cpp in RAM where it streamed its repacked copy (the same kernels on the same bytes)."""
    placement = placement or {}
    streams = placement.get("placement", "ram") != "ram" and placement.get("layout") != "repacked"
    return LlamaTarget(path, n_ctx=n_ctx, threads=threads, max_tree_nodes=max(sizes), kv_type=placement.get("kv_type", "f32"), streams=streams)


def check_report(report: dict, target: LlamaTarget, prompts: list[list[int]], sizes: list[int], end_ids: list[int]) -> dict:
    """Per row with differing answers: near ties and misses of each; the noise they were held to.
    An answer shorter than the report's max_tokens stopped on an end token (end_ids), which is
    checked where it stopped."""
    stopped = lambda answer: end_ids if len(answer) < report["max_tokens"] else None  # noqa: E731
    rows = [r for r in report["results"] if r.get("differing")]
    concerned = sorted({d["prompt"] for r in rows for d in r["differing"]})
    references = {d["prompt"]: d["reference"] for r in rows for d in r["differing"]}
    noise = max((pass_noise(target, prompts[i], references[i], sizes) for i in concerned), default=0.0)
    checked = []
    for row in rows:
        answers = []
        for d in row["differing"]:
            near, misses = greedy_misses(target, prompts[d["prompt"]], d["answer"], noise, stopped(d["answer"]))
            first = next(j for j, (a, b) in enumerate(zip(d["answer"] + [None], d["reference"] + [None])) if a != b)
            answers.append({"prompt": d["prompt"], "first_difference": first, "near_ties": near, "misses": misses})
        checked.append({"config": row["config"], "same": row.get("same_as_target"), "prompts": row["prompts"], "answers": answers})
    own = []
    for i in concerned:
        near, misses = greedy_misses(target, prompts[i], references[i], noise, stopped(references[i]))
        own.append({"prompt": i, "near_ties": near, "misses": misses})
    return {"noise": noise, "sizes": sizes, "rows": checked, "target_alone": own,
            "misses": sum(len(a["misses"]) for r in checked for a in r["answers"])}


def prompts_of(report: dict, tokenizer: Tokenizer) -> list[list[int]]:
    """The report's prompts as the bench encoded them (its set, the first `prompts` of it)."""
    return prompt_sets.encoded(report["prompt_set"], report["prompts"], tokenizer)


def summary_line(name: str, check: dict) -> str:
    parts = []
    for row in check["rows"]:
        ties = sum(1 for a in row["answers"] if not a["misses"])
        parts.append(f"{row['config'][:40]}: {row['same']}/{row['prompts']} equal, {ties} near-tie only, "
                     f"{len(row['answers']) - ties} with misses")
    return f"{name} (noise {check['noise']:.3g}): " + ("; ".join(parts) or "every answer equal to the target alone's")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ondevice.eval.tie_check", description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--sizes", default="2,8,16,32", help="pass sizes the batch noise is measured at")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write every check as JSON here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    path = local_path(load_pair(None).target)
    tokenizer = Tokenizer(path)
    end_ids = tokenizer.end_ids()
    checks = {}
    for name in args.reports:
        report = json.loads(name.read_text())
        if not any(r.get("differing") for r in report["results"]):
            print(f"{name}: every answer equal to the target alone's")
            continue
        prompts = prompts_of(report, tokenizer)
        n_ctx = max(len(p) for p in prompts) + report["max_tokens"] + max(sizes) + 8
        target = open_target(path, report.get("placement"), n_ctx, sizes, args.threads)
        try:
            checks[str(name)] = check = check_report(report, target, prompts, sizes, end_ids)
        finally:
            target.close()
        print(summary_line(str(name), check), flush=True)
    if args.out:
        args.out.write_text(json.dumps(checks, indent=1) + "\n")


if __name__ == "__main__":
    main()
