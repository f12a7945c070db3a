"""Teacher-forced acceptance of a drafter of another tokenizer, TLI against SLEM.

The target alone answers each prompt greedily; then, at every position of that answer, the
cross-vocabulary drafter drafts a tree for the context so far and we count how many drafted tokens a
greedy verifier would accept (the longest path spelling the answer's next target tokens). Acceptance
does not depend on how busy the machine is, so this compares the two modes on a shared machine.

    python scripts/cross_vocab_acceptance.py TARGET.gguf DRAFTER.gguf --prompts heldout16-code --limit 2 -n 48
"""

from __future__ import annotations

import argparse

from ondevice.draft.cross_vocab import CrossVocabDrafter
from ondevice.draft.llama_drafter import LlamaDrafter
from ondevice.draft.text_bridge import TextBridge
from ondevice.draft.vocab_map import VocabMap
from ondevice.pipeline import load
from ondevice.bench import prompt_sets
from ondevice.prompt.tokenizer import Tokenizer
from ondevice.decode.protocols import DraftSpec
from ondevice.decode.verify import child_index

SPECS = (DraftSpec("chain", 4), DraftSpec("best-first", 16))


def accepted(tree, answer: list[int], at: int) -> int:
    child, node, n = child_index(tree), 0, 0
    while at + n < len(answer) and (node, answer[at + n]) in child:
        node, n = child[(node, answer[at + n])], n + 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("drafter")
    parser.add_argument("--prompts", default="heldout16-code")
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("-n", "--max-tokens", type=int, default=48)
    args = parser.parse_args()
    alone = load(target=args.target, draft=False, target_backend="llama", threads=2)
    cases = []
    for text in prompt_sets.SETS[args.prompts][: args.limit]:
        ids = alone.encode_chat(prompt_sets.messages(text))
        answer = [t for r in alone.stream_tokens(ids, max_tokens=args.max_tokens) for t in r.token_ids]
        cases.append((ids, answer))
    alone.close()
    target, drafter = Tokenizer(args.target), Tokenizer(args.drafter)
    vocab_map = VocabMap.load(target, drafter)
    model = LlamaDrafter(args.drafter, n_ctx=2048, threads=2)
    for mode in ("tli", "slem"):
        for spec in SPECS:
            total = rounds = 0
            for ids, answer in cases:
                cross = CrossVocabDrafter(model, vocab_map, TextBridge(target, drafter), mode=mode)
                for at in range(len(answer)):
                    total += accepted(cross.draft(ids + answer[:at], spec), answer, at)
                    rounds += 1
            print(f"{mode} {spec.builder}@{spec.budget}: {total / rounds:.2f} drafted tokens accepted per round "
                  f"({rounds} rounds, {len(cases)} prompts)", flush=True)


if __name__ == "__main__":
    main()
