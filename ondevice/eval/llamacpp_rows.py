"""`python -m ondevice.eval.llamacpp_rows`: llama-cpp-python's bench rows alone, in a process of their
own (as a llama.cpp user runs them; `ondevice bench --baselines` runs the same rows in the bench's
process). The rows themselves: `ondevice.bench.llamacpp_rows`.

    python -m ondevice.eval.lowmem --cgroup 1.2GB -- python -m ondevice.eval.llamacpp_rows --prompts chat --limit 2 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ondevice.bench.llamacpp_rows import llamacpp_name, run_named
from ondevice.catalog.choose import choose
from ondevice.machine.ram import peak_rss
from ondevice.bench import prompt_sets
from ondevice.prompt.tokenizer import Tokenizer


def main(argv: list[str] | None = None) -> None:
    """The llama-cpp-python rows alone, on one of the bench's prompt sets, in this process."""
    parser = argparse.ArgumentParser(prog="python -m ondevice.eval.llamacpp_rows", description=main.__doc__)
    parser.add_argument("--pair", default=None, help="catalog pair (default: the default pair)")
    parser.add_argument("--target", default=None, help="a target GGUF of your own instead (as ondevice bench --target)")
    parser.add_argument("--drafter", default=None, help="a drafter GGUF of your own (as ondevice bench --drafter)")
    parser.add_argument("--prompts", choices=tuple(prompt_sets.SETS), default="chat", help="as ondevice bench --prompts")
    parser.add_argument("--limit", type=int, default=0, help="the first N prompts (0: all)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=256, help="context tokens (ondevice's bench sizes a streaming target's to its prompts)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="llama-cpp", help="comma-separated: llama-cpp, llama-cpp-spec@K")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    models = choose(args.pair, args.target, args.drafter, True)
    tokenizer = Tokenizer(models.target)
    ids = prompt_sets.encoded(args.prompts, args.limit, tokenizer)
    rows = []
    for name in args.rows.split(","):
        result, outputs = run_named(llamacpp_name(name.strip()), models, args.ctx, args.threads, ids, args.max_tokens, tokenizer.is_end)
        result.peak_rss_bytes = peak_rss()
        rows.append({**result.to_dict(), "outputs": outputs})
        print(f"{result.config}: {result.totals.tokens} tokens in {result.totals.decode_seconds:.1f} s, {result.tokens_per_second:.2f} tok/s")
    if args.out:
        Path(args.out).write_text(json.dumps({"prompts": args.prompts, "max_tokens": args.max_tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
