"""`ondevice serve` as a client meets it: the real server in a subprocess, the official openai client.

A tiny pair written by the tests (tiny_models.write_tiny_pair) in a temp ONDEVICE_HOME. References
are independent of the server: `ondevice generate --json` in its own process, or a freshly loaded
pipeline (empty cache) in this one.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from ondevice.serve.stops import StopMatcher
from serve_process import ServeProcess
from tiny_models import write_tiny_pair

LOAD = ["-m", "tiny", "--ctx", "512", "--threads", "1"]
DRAFT = ["--tree", "chain", "--budget", "4"]
KEY = "sk-test-key"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    write_tiny_pair(home, arch="llama", head_scale=3.0)  # peaked logits: no near-ties between batch shapes
    return {"ONDEVICE_HOME": str(home)}


@pytest.fixture(scope="module")
def server(env):
    with ServeProcess([*LOAD, *DRAFT, "--max-tokens", "64", "--max-request-size", "64KiB"], env, api_key=KEY) as s:
        yield s


def generate_json(env, prompt: str, *args: str) -> dict:
    """`ondevice generate --json` in its own process: the reference answer."""
    result = subprocess.run([sys.executable, "-m", "ondevice", "generate", prompt, *LOAD, *DRAFT, "--json", *args],
                            capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def fresh_answer(env, monkeypatch, messages, max_tokens: int) -> str:
    """The answer of a freshly loaded pipeline (nothing cached), drafting as the server does."""
    import ondevice
    from ondevice.decode.protocols import DraftSpec

    monkeypatch.setenv("ONDEVICE_HOME", env["ONDEVICE_HOME"])
    pipe = ondevice.load("tiny", threads=1, ctx=512)
    try:
        return "".join(r.text for r in pipe.stream(messages, max_tokens=max_tokens, spec=DraftSpec("chain", 4)))
    finally:
        pipe.close()


def chat(server, messages, **kwargs):
    return server.client().chat.completions.create(model="tiny", messages=messages, **{"temperature": 0, **kwargs})


def stream_text(server, messages, **kwargs) -> tuple[str, list]:
    chunks = list(server.client().chat.completions.create(model="default", messages=messages, temperature=0, stream=True, **kwargs))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# --- answers ----------------------------------------------------------------------------------------


def test_models_lists_the_served_pair(server):
    client = server.client()
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_equals_generate_streamed_and_not(server, env):
    ref = generate_json(env, "Tell me about the sea.", "-n", "48")
    whole = chat(server, user("Tell me about the sea."), max_tokens=48)
    assert whole.choices[0].message.content == ref["text"]
    assert whole.choices[0].finish_reason == ref["finish_reason"]
    assert whole.usage.prompt_tokens == len(ref["prompt_token_ids"]) and whole.usage.completion_tokens == len(ref["token_ids"])
    stats = whole.model_dump()["ondevice"]
    assert stats["tree"] == "chain" and stats["budget"] == 4 and stats["target_passes"] < len(ref["token_ids"])  # drafts accepted
    for key in ("tokens_per_pass", "tokens_per_second", "plan", "accepted_per_pass", "queue_seconds"):
        assert key in stats

    text, chunks = stream_text(server, user("Tell me about the sea."), max_tokens=48, stream_options={"include_usage": True})
    assert text == ref["text"]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref["finish_reason"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref["token_ids"])
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == len(ref["prompt_token_ids"]) - 1  # same prompt again: all cached


def test_completions_equal_generate_raw(server, env):
    ref = generate_json(env, "the quick brown fox", "--raw", "-n", "40")
    client = server.client()
    whole = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=40, temperature=0)
    assert whole.choices[0].text == ref["text"] and whole.usage.completion_tokens == len(ref["token_ids"])
    streamed = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=40, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == ref["text"]
    by_ids = client.completions.create(model="tiny", prompt=ref["prompt_token_ids"], max_tokens=40, temperature=0)
    assert by_ids.choices[0].text == ref["text"]


def test_stop_sequences_cut_the_answer(server):
    full = chat(server, user("Count for me."), max_tokens=64).choices[0].message.content
    start = next(i for i in range(8, len(full) - 2) if full[i : i + 2].isascii() and full[i : i + 2].isprintable())
    stop = full[start : start + 2]
    expected = full[: full.index(stop)]
    cut = chat(server, user("Count for me."), max_tokens=64, stop=["never here", stop])
    assert cut.choices[0].message.content == expected and cut.choices[0].finish_reason == "stop"
    assert stream_text(server, user("Count for me."), max_tokens=64, stop=stop)[0] == expected
    assert chat(server, user("Count for me."), max_tokens=64, stop="never here").choices[0].message.content == full


def test_sampling_is_seeded_and_top_k_goes_in_extra_body(server):
    ask = lambda seed, **kw: chat(server, user("Pick words."), max_tokens=24, seed=seed, **kw).choices[0].message.content  # noqa: E731
    hot = dict(temperature=1.5, top_p=0.95)
    a, b = ask(7, **hot), ask(7, **hot)
    assert a == b  # same seed, same sample
    assert len({ask(s, **hot) for s in range(6)}) > 1  # other seeds, other samples
    greedy = ask(1)
    assert ask(5, temperature=1.5, extra_body={"top_k": 1}) == greedy  # top_k 1 is the argmax


def test_eight_concurrent_requests_each_equal_to_alone(server):
    prompts = [user(f"{word} is my question number {i}.") for i, word in enumerate("alpha bravo charlie delta echo foxtrot golf hotel".split())]
    alone = [chat(server, p, max_tokens=32).choices[0].message.content for p in prompts]
    before = server.wait_queue(running=0)  # the worker counts an answer just after sending it

    def ask(i: int) -> str:
        return stream_text(server, prompts[i], max_tokens=32)[0] if i % 2 else chat(server, prompts[i], max_tokens=32).choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, range(8)))
    assert together == alone
    assert server.wait_queue(finished=before["finished"] + 8)["finished"] == before["finished"] + 8


def test_a_conversation_reuses_the_cached_prefix(server, env, monkeypatch):
    first = user("Tell me a story.")
    one = chat(server, first, max_tokens=24)
    second = first + [{"role": "assistant", "content": one.choices[0].message.content}] + user("And then?")
    two = chat(server, second, max_tokens=24)
    assert two.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens  # the first turn was not recomputed
    assert two.choices[0].message.content == fresh_answer(env, monkeypatch, second, 24)


def test_stop_matcher_equals_cutting_the_whole_text():
    """Random texts over a small alphabet, random stop sequences, random splits into pieces: what the
    matcher shows equals the whole text cut at its earliest stop sequence."""
    for seed in range(500):
        rng = random.Random(seed)
        text = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        found = [text.find(s) for s in stops if s in text]
        expected = text[: min(found)] if found else text
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        matcher = StopMatcher(stops)
        shown = "".join(matcher.push(p) for p in pieces) + matcher.flush()
        assert (shown, matcher.stopped) == (expected, bool(found)), (seed, text, stops, pieces)


# --- bad input: OpenAI-style errors, and the server stays up ---------------------------------------

MSG = [{"role": "user", "content": "hi"}]
BAD = [
    ("POST", CHAT, b"{not json", {}, 400, "not valid JSON"),
    ("POST", CHAT, b"[1, 2]", {}, 400, "JSON object"),
    ("POST", CHAT, {"model": "gpt-4o", "messages": MSG}, {}, 404, "model_not_found"),
    ("POST", CHAT, {"model": "tiny", "messages": []}, {}, 400, "at least one message"),
    ("POST", CHAT, {"model": "tiny"}, {}, 400, "messages"),
    ("POST", CHAT, {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, {}, 400, "role"),
    ("POST", CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "a b " * 3000}]}, {}, 400, "context_length_exceeded"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "max_tokens": 0}, {}, 400, "max_tokens"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "max_tokens": -5}, {}, 400, "max_tokens"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "max_tokens": 10**12}, {}, 400, "max_tokens"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "max_completion_tokens": 513}, {}, 400, "max_tokens"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "temperature": -1}, {}, 400, "temperature"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "temperature": "hot"}, {}, 400, "temperature"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "top_p": 0}, {}, 400, "top-p"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "top_k": -1}, {}, 400, "top-k"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "n": 3}, {}, 400, "n must be 1"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "presence_penalty": 1.0}, {}, 400, "presence_penalty"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, {}, 400, "stop"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "tools": [{"type": "function"}]}, {}, 400, "tool"),
    ("POST", CHAT, {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, {}, 400, "text content"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "pad": "x" * 70_000}, {}, 413, "request_too_large"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG, "chat_template_kwargs": {"enable_thinking": "yes"}}, {}, 400, "enable_thinking"),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": ""}, {}, 400, "empty"),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": ["one", "two"]}, {}, 400, "one prompt"),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": [5, 99999]}, {}, 400, "token ids"),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "x", "echo": True}, {}, 400, "echo"),
    ("GET", "/v1/nowhere", None, {}, 404, "no route"),
    ("DELETE", "/v1/models", None, {}, 405, "not allowed"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG}, {"Authorization": None}, 401, "invalid_api_key"),
    ("POST", CHAT, {"model": "tiny", "messages": MSG}, {"Authorization": "Bearer wrong"}, 401, "incorrect API key"),
    ("GET", "/v1/models", None, {"Authorization": "Basic " + KEY}, 401, "missing API key"),
]


@pytest.mark.parametrize("method,path,body,headers,status,words", BAD, ids=[f"{b[4]}-{b[5]}" for b in BAD])
def test_bad_input_gets_its_4xx_and_the_server_stays_up(server, method, path, body, headers, status, words):
    got, error = server.call(method, path, body, headers)
    assert got == status, error
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert words in json.dumps(error), error
    assert server.call("GET", "/health", headers={"Authorization": None})[0] == 200  # no key needed
    assert chat(server, MSG, max_tokens=2).choices[0].message.content is not None


def test_chunked_body_over_the_limit_is_413(server):
    def chunks():
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'"}]}'

    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", CHAT, body=chunks(), headers={"Authorization": f"Bearer {KEY}"}, encode_chunked=True)
    response = conn.getresponse()
    assert response.status == 413 and "request_too_large" in response.read().decode()
    assert server.health()["status"] == "ok"


def test_the_openai_client_sees_typed_errors(server):
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="gpt-4o", messages=MSG)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(model="tiny", messages=MSG)
    with pytest.raises(openai.BadRequestError, match="context"):
        chat(server, user("word " * 2000))
