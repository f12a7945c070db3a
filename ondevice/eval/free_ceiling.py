"""`python -m ondevice.eval.free_ceiling`: how fast free drafts could make the target on this machine's
curve, replayed over the target alone's own answers.

The target alone answers each prompt (greedy, llama.cpp, in RAM); then, on the profile's latency
curve t(n) (seconds of a pass over n tokens), each answer is decoded again on paper:

- target alone: one pass of 1 token per token;
- sized: the planner's rounds of the target alone (`TARGET_FREE`: the free sources' merged tree,
  priced by their record, sized to the pass, draft/sizing.py), a fresh router per set, as a new
  session would run them;
- ceiling: at every round the suffix index's best chain cut to exactly the tokens the target will
  accept (a pass of accepted + 1 tokens) — what a drafter that knew in advance how far its copy
  goes would reach with this source. No sizing rule can beat it with chains of this source.

Ratios are seconds of the target alone ÷ seconds of each, from the curve alone (no drafting or
Python overhead): a bound for what `ondevice bench` can measure, not a measurement.

    python -m ondevice.eval.free_ceiling --prompts edit,agent,heldout15-edit,heldout15-agent --max-tokens 128
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

from ondevice.draft.lookup import PromptLookupDrafter
from ondevice.draft.router import DraftRouter
from ondevice.draft.suffix_drafter import SuffixDrafter
from ondevice.errors import OndeviceError
from ondevice.paths import home
from ondevice.plan.curve import LatencyCurve
from ondevice.plan.fallback import MAX_LOOKUP_BUDGET, follow
from ondevice.bench import prompt_sets
from ondevice.decode.protocols import TARGET_FREE, DraftSpec
from ondevice.decode.tree import common_prefix

CEILING_CHAIN = 64  # the longest chain the ceiling looks at


def target_curve(profile: Path) -> LatencyCurve:
    return LatencyCurve.from_dict(json.loads(profile.read_text())["curves"]["target"])


def in_ram_profile() -> Path:
    found = sorted(p for p in glob.glob(str(home() / "profiles" / "*-cpu-t*.json")) if "-stream" not in p)
    if not found:
        raise OndeviceError("no profile measured in RAM here: run `ondevice profile` first, or pass --profile.")
    return Path(found[0])


def sized_seconds(answers: list[tuple[list[int], list[int]]], curve: LatencyCurve, n_vocab: int) -> tuple[float, int]:
    """(seconds, passes) of the planner's sized rounds over the answers, one session."""
    router = DraftRouter(None, PromptLookupDrafter(n_vocab))
    spec = DraftSpec(TARGET_FREE, MAX_LOOKUP_BUDGET, pass_seconds=tuple(curve(k) for k in range(1, MAX_LOOKUP_BUDGET + 2)))
    seconds, passes = 0.0, 0
    for prompt, answer in answers:
        i = 0
        while i < len(answer):
            tree = router.draft(prompt + answer[:i], spec)
            i += min(len(follow(tree, answer[i:])), len(answer) - i)
            seconds, passes = seconds + curve(len(tree)), passes + 1
    return seconds, passes


def ceiling_seconds(answers: list[tuple[list[int], list[int]]], curve: LatencyCurve) -> tuple[float, int]:
    """(seconds, passes) when every round verifies exactly the accepted run of the suffix index's best chain."""
    suffix = SuffixDrafter(n_vocab=0)
    seconds, passes = 0.0, 0
    for prompt, answer in answers:
        i = 0
        while i < len(answer):
            context = prompt + answer[:i]
            suffix.index.sync(context)
            tree = suffix.propose(context[-1], CEILING_CHAIN)
            chain = [int(tree.tokens[j]) for j in tree.likely_path()[1:]]
            run = common_prefix(chain, answer[i : len(answer) - 1])  # the last token is the target's own
            i += run + 1
            seconds, passes = seconds + curve(run + 1), passes + 1
    return seconds, passes


def main(argv: list[str] | None = None) -> None:
    """Free drafts replayed over the target alone's answers, on this machine's latency curve."""
    parser = argparse.ArgumentParser(prog="python -m ondevice.eval.free_ceiling", description=main.__doc__)
    parser.add_argument("--prompts", default="edit,agent", help="comma-separated prompt sets (as ondevice bench --prompts)")
    parser.add_argument("--limit", type=int, default=0, help="the first N prompts of each set (0: all)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--profile", type=Path, default=None, help="a profile JSON (default: this home's in-RAM one)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    import ondevice

    curve = target_curve(args.profile or in_ram_profile())
    rows = []
    with ondevice.load(target_backend="llama", draft=False) as pipe:
        for name in args.prompts.split(","):
            answers = []
            for prompt in prompt_sets.SETS[name][: args.limit or None]:
                ids = pipe.encode_chat(prompt_sets.messages(prompt))
                answers.append((ids, [t for r in pipe.stream_tokens(ids, max_tokens=args.max_tokens) for t in r.token_ids]))
            tokens = sum(len(a) for _, a in answers)
            alone = tokens * curve(1)
            sized, sized_passes = sized_seconds(answers, curve, pipe.engine.target.n_vocab)
            ceiling, ceiling_passes = ceiling_seconds(answers, curve)
            rows.append({"prompts": name, "tokens": tokens, "sized_speedup": alone / sized, "sized_tokens_per_pass": tokens / sized_passes,
                         "ceiling_speedup": alone / ceiling, "ceiling_tokens_per_pass": tokens / ceiling_passes})
            print(f"{name}: {tokens} tokens; sized {alone / sized:.2f}x the target alone ({tokens / sized_passes:.2f} tokens/pass), "
                  f"ceiling {alone / ceiling:.2f}x ({tokens / ceiling_passes:.2f})", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"curve": curve.to_dict(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
