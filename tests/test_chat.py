"""`ondevice chat` as a person uses it: a real terminal (pty), real keys (Ctrl-C is the byte the tty
turns into SIGINT, Ctrl-D ends input), a tiny catalog pair in a temp ONDEVICE_HOME. The reference for
every answer is a fresh pipeline given the same conversation (the Python API, greedy)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

import ondevice
from ondevice.cli.chat_cmd import fit_history
from ondevice.decode.protocols import DraftSpec
from tiny_models import write_tiny_pair

CTRL_C, CTRL_D = b"\x03", b"\x04"
LOAD = ["-m", "tiny", "--target-backend", "llama", "--threads", "1"]
TREE = ["--tree", "chain", "--budget", "3"]


@pytest.fixture
def tiny_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_HOME", str(tmp_path))
    write_tiny_pair(tmp_path, arch="llama", head_scale=3.0)
    return tmp_path


class TerminalChat:
    """`ondevice chat ARGS` on a pseudo-terminal: what it prints is read back as raw bytes."""

    def __init__(self, *args: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal, stdin/stdout/stderr
            for sig in (signal.SIGINT, signal.SIGQUIT):  # as in a user's shell: a runner started in the
                signal.signal(sig, signal.SIG_DFL)  # background without job control hands them down ignored
            os.execvpe(sys.executable, [sys.executable, "-m", "ondevice", "chat", *args], {**os.environ, "PYTHONIOENCODING": "utf-8", "PYTHONFAULTHANDLER": "1"})
        self.output = b""

    def read_until(self, marker: bytes, start: int = 0, timeout: float = 120) -> int:
        """Read until `marker` appears at or after `start`; returns the position just past it."""
        deadline = time.monotonic() + timeout
        while (at := self.output.find(marker, start)) < 0:
            if time.monotonic() > deadline or not self._read(deadline - time.monotonic()):
                raise AssertionError(f"{marker!r} never came; the chat printed:\n{self.output.decode(errors='replace')}")
        return at + len(marker)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # the child has exited
            return False
        self.output += chunk
        return bool(chunk)

    def send(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def exit_code(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGABRT)  # faulthandler prints every thread's stack: where it hung
        time.sleep(2)
        self._read(1)
        os.kill(self.pid, 9)
        raise AssertionError(f"the chat did not exit; it printed:\n{self.output.decode(errors='replace')[-6000:]}")


def reference(messages: list[dict], max_tokens: int, n_ctx: int) -> str:
    """A fresh session's greedy answer to `messages` (chain @3, as the chat runs)."""
    with ondevice.load("tiny", target_backend="llama", threads=1, ctx=n_ctx) as pipe:
        return "".join(r.text for r in pipe.stream(messages, max_tokens=max_tokens, spec=DraftSpec("chain", 3)))


def shown(text: str) -> bytes:
    """How a terminal shows printed text: the tty turns each newline into CR LF."""
    return text.replace("\n", "\r\n").encode()


def test_ctrl_c_stops_the_answer_and_the_session_goes_on(tiny_home):
    first, second, n = "why is the sky blue", "and another", 1500
    with ondevice.load("tiny", target_backend="llama", threads=1, ctx=4096) as pipe:  # precondition
        stats = [r.stats for r in pipe.stream([{"role": "user", "content": first}], max_tokens=n, spec=DraftSpec("chain", 3))][-1]
    assert stats.finish_reason == "length"  # the first answer runs long: there is time to stop it

    chat = TerminalChat(*LOAD, *TREE, "--ctx", "4096", "-n", str(n))
    at = chat.read_until(b">>> ")
    chat.send(first.encode() + b"\n")
    at = chat.read_until(first.encode() + b"\r\n", at)
    chat.read_until(b"", at + 1)  # the first piece of the answer
    chat.send(CTRL_C)
    at = chat.read_until(b"stopped", at)
    at = chat.read_until(b">>> ", at)  # back at the prompt, same session

    chat.send(second.encode() + b"\n")
    at = chat.read_until(second.encode() + b"\r\n", at)
    answer_end = chat.read_until(b"tok/s", at)  # the stats line after the answer
    chat.read_until(b">>> ", answer_end)
    chat.send(CTRL_D)  # Ctrl-D at an empty prompt
    assert chat.exit_code() == 0
    assert b"Traceback" not in chat.output

    # As in ollama, the stopped answer is left out: the question stays, then the next one.
    expected = reference([{"role": "user", "content": first}, {"role": "user", "content": second}], n, 4096)
    assert chat.output[at:].startswith(shown(expected) + b"\r\n")


def test_ctrl_c_at_the_prompt_ends_the_chat_cleanly(tiny_home):
    chat = TerminalChat(*LOAD, "--ctx", "256")
    chat.read_until(b">>> ")
    chat.send(CTRL_C)
    assert chat.exit_code() == 0
    assert b"Traceback" not in chat.output and b"Aborted" not in chat.output


def test_a_long_conversation_drops_its_oldest_turns(tiny_home):
    """A context of 256 tokens, answers of up to 40: by the fourth question the first turns must go,
    with one notice each time, and every question still gets an answer."""
    questions = ["what is a fox", "tell me more about it", "where does it live", "and what does it eat", "thanks"]
    script = "".join(q + "\n" for q in questions)
    result = subprocess.run([sys.executable, "-m", "ondevice", "chat", *LOAD, *TREE, "--ctx", "256", "-n", "40"],
                            input=script, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("tok/s") == len(questions)  # a stats line after every answer
    notices = [line for line in result.stderr.splitlines() if "no longer fits the context" in line]
    assert notices and all("dropped its oldest" in line for line in notices)


def test_fit_history_keeps_the_newest_turns_that_fit(tiny_home):
    with ondevice.load("tiny", target_backend="llama", threads=1, ctx=128) as pipe:
        history = []
        for i in range(6):
            history += [{"role": "user", "content": f"question {i} " * 3}, {"role": "assistant", "content": f"answer {i} " * 4}]
        history.append({"role": "user", "content": "last question"})
        full = list(history)
        ids, removed = fit_history(pipe, [], history, reserve=40)
        assert history == full[removed:] and history[0]["role"] == "user"  # whole turns, oldest first
        assert ids == pipe.encode_chat(history) and len(ids) + 40 <= 128
        one_more_turn = full[removed - 2 :]
        assert len(pipe.encode_chat(one_more_turn)) + 40 > 128  # nothing was dropped that would have fitted
