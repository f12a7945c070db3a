"""`ondevice serve` under clients that leave and signals that stop it, on a tiny pair.

Long answers (thousands of tokens, one per target pass) keep the engine busy for seconds, so a second
request really waits and a disconnect really lands mid-answer; the queue counts in /health say what
happened to each job (finished, or cancelled before its end).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import openai
import pytest

from serve_process import ServeProcess
from tiny_models import write_tiny_pair

LONG = ["-m", "tiny", "--ctx", "4096", "--threads", "1", "--no-draft"]
PROMPT = [{"role": "user", "content": "Go on and on."}]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    write_tiny_pair(home, arch="llama", head_scale=3.0, endless=True)  # greedy answers run to max_tokens
    return {"ONDEVICE_HOME": str(home)}


def long_stream(server: ServeProcess, max_tokens: int = 4000):
    """A streamed answer that runs for seconds, started (its first content chunk already read)."""
    stream = server.client().chat.completions.create(model="tiny", messages=PROMPT, max_tokens=max_tokens, stream=True,
                                                     stream_options={"include_usage": True})
    chunks = iter(stream)
    while not next(chunks).choices[0].delta.content:
        pass
    return stream, chunks


def send_request(server: ServeProcess, max_tokens: int = 8, **state) -> http.client.HTTPConnection:
    """A non-streamed request sent (not yet answered); returns its open connection once /health's
    queue shows `state` (e.g. waiting=1)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": "tiny", "messages": PROMPT, "max_tokens": max_tokens}),
                 {"Content-Type": "application/json"})
    server.wait_queue(**state)
    return conn


def test_waiting_request_cancelled_disconnect_stops_the_answer_and_the_next_is_right(env):
    with ServeProcess(LONG, env) as server:
        client = server.client()
        alone = client.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=48, temperature=0).choices[0].message.content

        stream, _ = long_stream(server)
        waiting = send_request(server, waiting=1)
        waiting.close()  # the client gives up while its request waits: dropped from the queue, never run
        queue = server.wait_queue(waiting=0, cancelled=1)
        assert (queue["waiting"], queue["running"], queue["finished"], queue["cancelled"]) == (0, 1, 1, 1)

        stream.close()  # the client leaves mid-stream: the answer stops at the next pass, long before its 4000 tokens
        queue = server.wait_queue(running=0, cancelled=2)
        assert (queue["running"], queue["finished"], queue["cancelled"], queue["failed"]) == (0, 1, 2, 0)
        assert queue["tokens"] - 48 < 4000

        send_request(server, max_tokens=4000, running=1).close()  # the same for a non-streamed answer
        queue = server.wait_queue(running=0, cancelled=3)
        assert (queue["finished"], queue["cancelled"]) == (1, 3) and queue["tokens"] - 48 < 8000

        again = client.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=48, temperature=0)
        assert again.choices[0].message.content == alone  # the cache left by the stopped answer is consistent
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        assert server.stop() == 0


def test_sigterm_finishes_the_answer_in_flight_refuses_waiting_ones_and_frees_the_models(env):
    with ServeProcess(LONG, env) as server:
        stream, chunks = long_stream(server, max_tokens=3000)
        waiting = send_request(server, waiting=1)
        server.proc.send_signal(signal.SIGTERM)
        refused = waiting.getresponse()
        assert refused.status == 503 and "shutting down" in json.loads(refused.read())["error"]["message"]
        rest = list(chunks)
        assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
        assert rest[-1].usage.completion_tokens == 3000  # the answer in flight was finished, not cut
        assert server.proc.wait(120) == 0
        log = server.log()
        assert "stopped; models freed · 1 answers, 1 cancelled, 0 failed, 3000 tokens generated" in log and "Traceback" not in log
        with pytest.raises(openai.APIConnectionError):
            server.client().models.list()


def test_second_ctrl_c_stops_the_answer_in_flight_and_public_host_warns(env):
    with ServeProcess([*LONG, "--host", "0.0.0.0"], env) as server:
        assert "warning: listening on 0.0.0.0 without --api-key" in server.log()
        stream, chunks = long_stream(server, max_tokens=4000)
        server.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # uvicorn notices the first signal and begins to wait for the answer
        server.proc.send_signal(signal.SIGINT)
        received = []
        with pytest.raises(openai.APIError):  # the connection closes before the answer ends
            for chunk in chunks:
                received.append(chunk)
        assert not any(c.choices and c.choices[0].finish_reason for c in received)
        assert server.proc.wait(120) == 0
        counts = re.search(r"stopped; models freed · (\d+) answers, (\d+) cancelled, (\d+) failed, (\d+) tokens generated", server.log())
        assert counts and counts.groups()[:3] == ("0", "1", "0") and int(counts[4]) < 4000  # stopped at the next pass


@pytest.mark.parametrize("args,words", [
    (["--tree", "bushy"], ["bushy"]),
    (["--max-request-size", "lots"], ["lots"]),
    (["--temperature", "-1"], ["temperature"]),
    (["--port", "PORT"], ["in use", "--port"]),  # a busy port fails before any model loads
])  # fmt: skip
def test_bad_serve_options_are_one_line_errors(env, args, words):
    from test_cli import assert_one_line_error

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = [str(busy.getsockname()[1]) if a == "PORT" else a for a in args]
        result = subprocess.run([sys.executable, "-m", "ondevice", "serve", "-m", "tiny", *args], capture_output=True, text=True,
                                timeout=300, env={**os.environ, **env})
    assert_one_line_error(result, *words)
