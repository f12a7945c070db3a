"""How much of the target's own output a VocabTrim keep set covers, by prompt set and by K.

    python scripts/keep_set_coverage.py TARGET.gguf DRAFTER.gguf --prompts heldout33-code,heldout33-chat \\
        [--max-tokens 64] [--k 32768,49152,65536] [--shipped PAIR] [--keep-set FILE ...]

The target answers each prompt greedily in RAM, as `quant vocab-trim` calibrates; each answer's
tokens are looked up in the keep sets: the pair's shipped set (--shipped, if its drafter is this
DRAFTER file) and, for each K, the set `ondevice quant vocab-trim --k K` would keep with no
calibration counts at all (the always-kept ids, then the lowest ids: the order the ties of every
calibration fall back to), and any --keep-set file written as the catalog ships them (an earlier
commit's: `git show REV:models/PAIR.vocab-trim.json > FILE`). A token outside the set can never be
drafted, so a chain stops there whatever the drafter thinks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

from ondevice.bench.prompt_sets import SETS
from ondevice.vocabtrim.build import always_kept_ids, calibration_token_counts, coverage, file_sha256, top_k_tokens
from ondevice.vocabtrim.shipped import read_keep_set, shipped_keep_ids


def answers(target_path: str, names: list[str], max_tokens: int) -> dict[str, np.ndarray]:
    """Every token of the target's greedy answers, by prompt set (as `quant vocab-trim` calibrates)."""
    prompts = [(name, p) for name in names for p in SETS[name]]
    found: dict[str, list[int]] = {name: [] for name in names}
    calibration_token_counts(target_path, [p for _, p in prompts], max_tokens,
                             on_prompt=lambda index, answer: found[prompts[index][0]].extend(answer))
    return {name: np.asarray(ids, dtype=np.int64) for name, ids in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("drafter")
    parser.add_argument("--prompts", required=True, help="prompt sets, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", default="32768,49152,65536")
    parser.add_argument("--shipped", default="qwen2.5-coder-1.5b", help="the catalog pair whose shipped set to check ('' for none)")
    parser.add_argument("--keep-set", action="append", default=[], help="a keep set file in the catalog's format")
    args = parser.parse_args()
    reader = gguf.GGUFReader(args.drafter)
    always = always_kept_ids(reader)
    counts = np.zeros(len(reader.fields["tokenizer.ggml.tokens"].data))
    sets = {f"ids only, K={k}": top_k_tokens(counts, int(k), always) for k in args.k.split(",")}
    sha256 = file_sha256(Path(args.drafter))
    shipped = shipped_keep_ids(args.shipped, sha256) if args.shipped else None
    files = {path: read_keep_set(Path(path), sha256) for path in args.keep_set}
    chosen = ([(f"shipped (K={len(shipped[0])})", shipped[0])] if shipped is not None else []) + [
        (f"{Path(path).name} (K={len(found[0])})", found[0]) for path, found in files.items() if found is not None]
    sets = dict(chosen) | sets
    tokens = answers(args.target, args.prompts.split(","), args.max_tokens)
    print("keep set".ljust(24) + "".join(name.rjust(18) for name in tokens))
    for label, keep in sets.items():
        print(label.ljust(24) + "".join(f"{coverage(t, keep):18.2%}" for t in tokens.values()))
    print("tokens".ljust(24) + "".join(f"{len(t):18d}" for t in tokens.values()))


if __name__ == "__main__":
    main()
