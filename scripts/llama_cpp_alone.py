"""llama-cpp-python's `Llama` alone on any GGUF, raw token ids: seconds per generated token.

    python scripts/llama_cpp_alone.py MODEL.gguf [--tokens 12] [--threads 2]

For files that answer nothing readable (a synthetic model of random weights: `ondevice bench
--synthetic NAME --keep` writes them), where `python -m ondevice.eval.llamacpp_rows` needs a chat
template. Greedy after a 32-token prompt of arbitrary ids; loaded as that baseline loads its target
(`llamacpp_rows.load_llama`). Prints one JSON line: the first token's seconds (prompt included),
each later token's, and their tok/s.
"""

from __future__ import annotations

import argparse
import json
import time

from ondevice.bench.llamacpp_rows import load_llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    llm = load_llama(args.model, 256, args.threads)
    seconds, start = [], time.perf_counter()
    for _ in llm.generate(list(range(1000, 1032)), temp=0.0):
        seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        if len(seconds) >= args.tokens:
            break
    later = seconds[1:]
    print(json.dumps({"first_token_s": seconds[0], "per_token_s": later, "tokens_per_second": len(later) / sum(later)}))


if __name__ == "__main__":
    main()
