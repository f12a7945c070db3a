"""The default pair's two files passed by path run exactly as the catalog pair (greedy, same tokens)."""

from __future__ import annotations

from ondevice.pipeline import load
from ondevice.decode.protocols import DraftSpec

PROMPT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]


def answer(pipe, spec) -> list[int]:
    ids = pipe.encode_chat(PROMPT)
    return [t for record in pipe.stream_tokens(ids, max_tokens=32, spec=spec) for t in record.token_ids]


def test_catalog_pair_by_path_equals_the_catalog_pair(real_pair):
    spec = DraftSpec("best-first", budget=8)
    options = dict(target_backend="llama", ctx=512, threads=2)
    with load(**options) as pipe:
        reference, name = answer(pipe, spec), pipe.pair.name
    with load(target=str(real_pair.target), drafter=str(real_pair.drafter), **options) as pipe:
        assert pipe.pair.name == name  # the same pair: same profile and acceptance records
        assert answer(pipe, spec) == reference and len(reference) == 32
