"""What growing the carried best-first search saves the next round (docs/measurements/2026-11-27-streaming-1.2gb.md).

Drafting in a streamed pass's disk waits can only grow the search of the tree being verified: the
verdict is not known yet. This grows it by N nodes before every target pass (the real pair, in RAM,
greedy, best-first @8) and prints how often the next round started from the grown search, and the
drafting per round left:

    python scripts/carried_growth.py --grow 0 4 16 --prompts chat --limit 1
"""

from __future__ import annotations

import argparse

from ondevice.catalog.hub import local_path
from ondevice.catalog.pairs import load_pair
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.decode.engine import SpecEngine, Step
from ondevice.bench.prompt_sets import SETS
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.protocols import DraftSpec
from ondevice.targets.llama_target import LlamaTarget


def run(target_path, drafter_path, prompts: list[str], grow: int, budget: int, max_tokens: int) -> dict:
    tokenizer = Tokenizer(target_path)
    target = LlamaTarget(target_path, n_ctx=1024, threads=2)
    drafter = LlamaDrafter(drafter_path, n_ctx=1024, threads=2)
    verify = target.forward_tree

    def grow_then_verify(tree):
        asked = iter(range(grow + 1))
        drafter.grow(lambda: next(asked) == grow)  # `grow` expansions of the search `tree` came from
        return verify(tree)

    target.forward_tree = grow_then_verify
    engine = SpecEngine(target, drafter, tokenizer.is_end)
    passes = tokens = 0
    hits = draft = 0.0
    for prompt in prompts:
        engine.cached = []
        for item in engine.generate(tokenizer.encode_user(prompt), max_tokens, spec=DraftSpec("best-first", budget)):
            if not isinstance(item, Step):
                passes, tokens = passes + item.target_passes, tokens + item.tokens
                hits, draft = hits + item.overlap_hits, draft + item.draft_seconds
    engine.close()
    return {"grown_per_pass": grow, "passes": passes, "tokens_per_pass": tokens / passes,
            "carried_share": hits / passes, "draft_ms_per_pass": 1e3 * draft / passes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grow", type=int, nargs="+", default=[0, 4, 16])
    parser.add_argument("--prompts", default="chat")
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    pair = load_pair()
    target, drafter = local_path(pair.target), local_path(pair.drafter)
    for grow in args.grow:
        print(run(target, drafter, SETS[args.prompts][: args.limit], grow, args.budget, args.max_tokens))


if __name__ == "__main__":
    main()
