"""`ondevice serve` on the real pair (Qwen2.5-Coder 1.5B / 0.5B), through the official openai client.

Heavy: run under `flock /tmp/ondevice-heavy.lock`. Chain drafts of 4 keep every target pass under 8
tokens, where llama.cpp's logits are bit-exact whatever the batch (see README, Exactness), so greedy
answers can be compared token for token. The prompts start with different words: after the shared
chat-template prefix each one is prefilled from the same point whatever ran before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from serve_process import ServeProcess

pytestmark = pytest.mark.real

ARGS = ["--target-backend", "llama", "--threads", "2", "--tree", "chain", "--budget", "4", "--ctx", "2048"]
QUESTIONS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a Python list comprehension is, in two sentences.",
    "Give a one-line shell command that counts the lines of all .py files.",
    "Name three differences between TCP and UDP.",
    "Reverse a string in JavaScript: show the shortest way.",
    "What does the SQL keyword HAVING do?",
    "Suggest a name for a function that parses dates from log lines.",
    "Convert 0x1F to decimal and explain the steps briefly.",
]


@pytest.fixture(scope="module")
def server(real_pair):
    with ServeProcess([*ARGS, "--max-tokens", "64"], {}) as s:
        yield s


def ask(server, question: str, max_tokens: int, stream: bool = False) -> str:
    messages = [{"role": "user", "content": question}]
    create = server.client().chat.completions.create
    if stream:
        chunks = create(model="default", messages=messages, max_tokens=max_tokens, temperature=0, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return create(model="qwen2.5-coder-1.5b", messages=messages, max_tokens=max_tokens, temperature=0).choices[0].message.content


def test_real_chat_equals_generate_streamed_and_not(server):
    result = subprocess.run([sys.executable, "-m", "ondevice", "generate", QUESTIONS[0], *ARGS, "-n", "48", "--json"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    reference = json.loads(result.stdout)["text"]
    assert ask(server, QUESTIONS[0], 48) == reference
    assert ask(server, QUESTIONS[0], 48, stream=True) == reference


def test_real_eight_concurrent_requests_each_equal_to_alone(server):
    alone = [ask(server, q, 24) for q in QUESTIONS]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: ask(server, QUESTIONS[i], 24, stream=bool(i % 2)), range(8)))
    assert together == alone


def test_real_disconnect_mid_stream_then_the_next_request_is_right(server):
    expected = ask(server, QUESTIONS[3], 24)
    before = server.wait_queue(running=0)
    stream = server.client().chat.completions.create(model="default", messages=[{"role": "user", "content": QUESTIONS[1]}],
                                                     max_tokens=400, temperature=0, stream=True)
    pieces = 0
    for chunk in stream:
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
        if pieces == 5:
            break
    stream.close()
    queue = server.wait_queue(running=0, cancelled=before["cancelled"] + 1)
    assert queue["cancelled"] == before["cancelled"] + 1 and queue["tokens"] - before["tokens"] < 400
    assert ask(server, QUESTIONS[3], 24) == expected
