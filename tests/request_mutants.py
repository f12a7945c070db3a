"""Malformed HTTP requests for the server fuzz test: seeded mutants of valid OpenAI requests.

Each mutant is (label, method, path, body bytes, headers). Field values are replaced by values of
every other JSON type and by hostile ones (huge, negative, NaN, deep nesting, long strings, invalid
UTF-8, lone surrogates, integers past Python's 4,300 digits, subnormal floats); bodies are truncated or have bytes flipped; some go to other paths or methods.
"""

from __future__ import annotations

import json
import random

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
COMPLETION = {"model": "default", "prompt": "the quick", "max_tokens": 4, "temperature": 0}
FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
          "stream_options", "n", "presence_penalty", "frequency_penalty", "logprobs", "tools", "response_format",
          "chat_template_kwargs", "prompt", "echo", "suffix", "best_of"]  # fmt: skip
HOSTILE = [None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63), 2**64 + 1, 10**30, 0.5, -0.5, 1e308, "5", "0.5", "", "x" * 5000,
           "\ud800", "\x00", [], [True], [1, -1], [[1]], [None], {}, {"a": 1}, {"role": "user"},
           [{"role": "user", "content": [{"type": "text", "text": 5}]}], [{"role": "wizard", "content": "x"}],
           [{"role": "user", "content": {"nested": True}}], [{"role": "user", "content": None}], ["stop"] * 9]  # fmt: skip
RAW_VALUES = ["NaN", "Infinity", "-Infinity", "1e999", "[" * 5000 + "]" * 5000, '"\\ud800"', "9" * 5000, "1e-320", "5e-324",
              '[{"role": "user", "content": "\\udfff"}]', '["a\\ud800"]']  # fmt: skip


def mutants(seed: int, n: int):
    rng = random.Random(seed)
    for i in range(n):
        base = dict(rng.choice([CHAT, COMPLETION]))
        path = "/v1/chat/completions" if "messages" in base else "/v1/completions"
        kind = rng.random()
        if kind < 0.6:
            field = rng.choice(FIELDS)
            value = rng.choice(HOSTILE)
            base[field] = value
            yield f"{i}: {field} = {_short(value)}", "POST", path, json.dumps(base).encode(), {}
        elif kind < 0.75:
            field, raw = rng.choice(FIELDS), rng.choice(RAW_VALUES)
            body = json.dumps({k: v for k, v in base.items() if k != field})[:-1] + f', "{field}": {raw}}}'
            yield f"{i}: {field} = {raw[:20]}", "POST", path, body.encode(), {}
        elif kind < 0.9:
            body = bytearray(json.dumps(base).encode())
            for _ in range(rng.randint(1, 6)):
                body[rng.randrange(len(body))] = rng.randrange(256)
            if rng.random() < 0.3:
                body = body[: rng.randrange(len(body))]
            yield f"{i}: bytes of the body", "POST", path, bytes(body), {}
        else:
            method, target = rng.choice([("GET", path), ("PUT", "/v1/models"), ("POST", "/health"), ("GET", "/v1/models/" + "x" * 3000),
                                         ("DELETE", "/v1/chat/completions"), ("POST", "/v1/../../etc/passwd")])
            yield f"{i}: {method} {target[:40]}", method, target, json.dumps(base).encode(), {"Content-Type": rng.choice(["text/plain", "application/json"])}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."
