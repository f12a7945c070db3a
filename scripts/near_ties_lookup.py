"""Exactness of the drafter-less streaming default: the target alone vs prompt lookup, per prompt.

    python scripts/near_ties_lookup.py heldout12-code heldout12-chat

Loads the default pair as a 1.2 GB budget plans it without the drafter (--ram-memory: the streaming
plan's f16 KV cache and unrepacked weights, as under the cgroup), answers each prompt with the target
alone and with prompt lookup (48 tokens, greedy), and where they differ checks both answers token by
token against the target alone one token per pass (eval/numerics.greedy_misses): near ties (top-2
margin below this machine's measured batch noise) or misses, which no numerics explain.
"""

import sys

import ondevice
from ondevice.catalog.choose import choose
from ondevice.eval.numerics import greedy_misses, pass_noise
from ondevice.bench.prompt_sets import SETS, messages
from ondevice.decode.protocols import DraftSpec
from ondevice.targets.llama_target import LlamaTarget


def tokens(pipe, prompt, spec) -> list[int]:
    return [t for r in pipe.stream(messages(prompt), max_tokens=48, spec=spec) for t in r.token_ids]


def main(sets: list[str]) -> None:
    prompts = [p for name in sets for p in SETS[name]]
    runs = []
    with ondevice.load(target_backend="llama", ram_memory="1.2GB", keep_drafter=False) as pipe:
        print(pipe.placement)
        for p in prompts:
            runs.append((p, pipe.encode_chat(messages(p)), tokens(pipe, p, None), tokens(pipe, p, DraftSpec("lookup", 6))))
    target = LlamaTarget(choose(None, None, None, True).target, kv_type="f16", n_ctx=1024, threads=2)
    for p, ids, alone, look in runs:
        if alone == look:
            print("equal  ", p[:50])
            continue
        first = next(j for j in range(min(len(alone), len(look))) if alone[j] != look[j])
        noise = pass_noise(target, ids, alone, [2, 7])
        print("differ ", p[:50], "from", first, f"noise {noise:.3f}", "alone (near ties, misses)", greedy_misses(target, ids, alone, noise),
              "lookup", greedy_misses(target, ids, look, noise))


if __name__ == "__main__":
    main(sys.argv[1:] or ["heldout12-code", "heldout12-chat"])
