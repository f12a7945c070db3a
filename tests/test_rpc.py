"""A target split across RPC workers (ondevice/rpc): the plan, the worker's endpoint, exactness, faults.

Tests that run llama.cpp's RPC server skip, naming the reason, when the installed llama-cpp-python
was built without it (the README's install command builds it: CMAKE_ARGS=-DGGML_RPC=ON)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from ondevice.errors import OndeviceError
from ondevice.loading.footprint import ModelSize
from ondevice.rpc import library
from ondevice.rpc.supervise import with_workers
from ondevice.loading.rpc_split import assign_layers, plan_split
from serve_process import free_port
from tiny_models import DIMS, write_tiny_gguf, write_tiny_pair

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "rpc_child.py"
needs_rpc = pytest.mark.skipif(
    not library.rpc_available(),
    reason="the installed llama-cpp-python has no RPC backend (install it with CMAKE_ARGS=-DGGML_RPC=ON, as the README does)",
)
MiB = 1 << 20


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(CHILD.parent), os.environ.get("PYTHONPATH", "")])}


@contextlib.contextmanager
def worker(*args: str, port: int | None = None):
    """`ondevice worker` in a subprocess, listening: yields (endpoint, Popen)."""
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ondevice", "worker", "--port", str(port), "--threads", "1", *args],
                            env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    endpoint = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not listening(proc.pid, port):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the worker did not listen within 60 s"
            time.sleep(0.1)
        yield endpoint, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def listening(pid: int, port: int) -> list:
    try:
        return [c for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    """A tiny Qwen2 GGUF with 4 decoder layers: one for this machine, the rest over the workers."""
    dims = dict(DIMS)
    DIMS.update(num_hidden_layers=4)
    try:
        return write_tiny_gguf(tmp_path_factory.mktemp("rpc") / "four.gguf", arch="qwen2", vocab=320)
    finally:
        DIMS.clear()
        DIMS.update(dims)


# --- the plan: sizes only ----------------------------------------------------------------------


def test_layers_go_in_contiguous_runs_in_proportion_to_room():
    runs = assign_layers([10] * 28, [100, 150, 150])
    assert [i for run in runs for i in run] == list(range(28))  # every layer once, in order
    assert [len(r) for r in runs] == [7, 11, 10]  # 280 bytes by rooms 1:1.5:1.5 → 70, 105, 105 (middles decide)
    assert all(sum(10 for _ in run) <= room for run, room in zip(runs, [100, 150, 150]))


def test_a_part_never_gets_more_than_its_room():
    # shares 28.1 and 91.9 bytes: layer 1's middle (28) falls in the first part, which would then hold 34 > 30
    assert assign_layers([22, 12, 86], [30, 98]) == [[0], [1, 2]]


def test_plan_split_puts_the_head_on_the_last_worker_and_refuses_too_little(four_layers):
    size = ModelSize.from_gguf(four_layers)
    big = 512 * MiB
    split = plan_split(size, big, [("a:1", 0, big), ("b:2", 0, big)], n_ctx=256, n_ubatch=256, max_tree=64)
    assert [p.head for p in split.parts] == [False, False, True]
    assert sorted(i for p in split.parts for i in p.layers) == list(range(size.n_layers))
    with pytest.raises(OndeviceError, match="add a worker"):
        plan_split(size, 0, [("a:1", 0, 1 * MiB)], n_ctx=256, n_ubatch=256, max_tree=64)


@pytest.mark.parametrize("bad", ["", "host", "host:0", "host:http", ":80", "a:1,a:1"])
def test_bad_worker_lists_are_one_line_errors(bad):
    with pytest.raises(OndeviceError):
        library.parse_workers(bad)


def test_without_rpc_built_the_flag_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(library, "rpc_available", lambda: False)
    with pytest.raises(OndeviceError, match="GGML_RPC=ON"):
        library.require_rpc()


# --- the worker --------------------------------------------------------------------------------


@needs_rpc
def test_worker_binds_localhost_by_default_and_warns():
    with worker() as (endpoint, proc):
        port = int(endpoint.rsplit(":", 1)[1])
        assert {c.laddr.ip for c in listening(proc.pid, port)} == {"127.0.0.1"}
        others = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                  if a.family == socket.AF_INET and not a.address.startswith("127.")]
        for address in others:  # not reachable from another interface of this machine
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=2).close()
        assert library.hello(endpoint)[0] == library.RPC_PROTO_MAJOR
        proc.kill()
        assert "no authentication" in proc.stderr.read()


@needs_rpc
def test_worker_offers_its_mem_limit_not_the_machines_ram():
    with worker("--mem", "300MB") as (endpoint, _):
        code = (f"from ondevice.rpc import library as l; d = l.worker_devices({endpoint!r})[0]; "
                "import json; print(json.dumps(l.device_memory(d)))")
        out = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60)
        free, total = json.loads(out.stdout)
        assert total == 300_000_000 and 0 < free <= total


# --- a split target ----------------------------------------------------------------------------


@needs_rpc
def test_split_logits_equal_the_local_targets_within_batch_noise(four_layers):
    with worker("--mem", "200MB") as (a, _), worker("--mem", "200MB") as (b, _):
        out = subprocess.run([sys.executable, str(CHILD), "logits", str(four_layers), f"{a},{b}"],
                             env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    parts = result["split"]["parts"]
    assert [len(p["layers"]) > 0 for p in parts] == [True, True, True]  # this machine and both workers compute layers
    traffic = result["traffic"]
    assert traffic["verify_passes"] >= 1 and traffic["round_trips_per_pass"] == 2.0, traffic  # each worker answers its part once
    assert traffic["bytes_received_per_pass"] >= 4 * 320, traffic  # at least one row of logits came back (vocab 320, f32)
    got, noise = result["split_vs_local"], result["noise"]
    print(json.dumps({"split_vs_local": got, "batch_noise": noise}))
    assert got["argmax_flips"] == 0 or got["min_margin"] <= noise["max_gap_delta"]
    assert got["max_gap_delta"] <= max(noise["max_gap_delta"], 0.0)


@needs_rpc
def test_a_worker_killed_mid_answer_ends_it_with_one_line_and_no_hang(four_layers):
    with worker("--mem", "200MB") as (a, proc):
        child = subprocess.Popen([sys.executable, str(CHILD), "kill", str(four_layers), a],
                                 env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            child.stdin.write("go\n")
            child.stdin.flush()
            _, err = child.communicate(timeout=60)  # no hang: a killed worker's connection fails at once
        finally:
            if child.poll() is None:
                child.kill()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    assert child.returncode == 3, err
    assert len(lines) == 1 and a in lines[0] and "stopped answering" in lines[0], err
    assert "Traceback" not in err


# --- chat and serve outlive a lost worker --------------------------------------------------------


def test_with_workers_replaces_or_drops_the_rpc_flag():
    assert with_workers(["chat", "--rpc", "a:1,b:2", "-n", "8"], ["b:2"]) == ["chat", "-n", "8", "--rpc", "b:2"]
    assert with_workers(["serve", "--rpc=a:1", "--port", "9"], []) == ["serve", "--port", "9"]


class Lines:
    """A child's stderr read line by line on a thread, so that waiting for a line has a deadline."""

    def __init__(self, stream):
        self.queue: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.queue.put(line) for line in stream], daemon=True).start()

    def until(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{text!r} never came; stderr so far:\n" + "".join(self.seen)) from None
            self.seen.append(line)
            if text in line:
                return line


@needs_rpc
def test_a_chat_that_loses_its_worker_answers_the_next_question_without_it(tmp_path):
    """The worker is killed between two questions: the second answer ends with one line naming it,
    the chat loads again on this machine alone, keeps the conversation and answers the third."""
    dims = dict(DIMS)
    DIMS.update(num_hidden_layers=4)
    try:
        write_tiny_pair(tmp_path, arch="qwen2")
    finally:
        DIMS.clear()
        DIMS.update(dims)
    with worker("--mem", "200MB") as (a, proc):
        chat = subprocess.Popen([sys.executable, "-m", "ondevice", "chat", "-m", "tiny", "--no-draft", "--rpc", a, "-n", "8", "--threads", "1",
                                 "--ctx", "512", "--ram-memory", "250MB"], env={**env(), "ONDEVICE_HOME": str(tmp_path)},
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            stderr = Lines(chat.stderr)
            assert a in stderr.until("target split")  # the placement line: layers on the worker
            chat.stdin.write("hello\n")
            chat.stdin.flush()
            stderr.until("tok/s")
            proc.kill()
            proc.wait()
            chat.stdin.write("and again\n")
            chat.stdin.flush()
            assert a in stderr.until("stopped answering")
            assert a in stderr.until("loading again on this machine alone")
            assert "target split" not in stderr.until("/help for commands")  # the placement line: all of it here
            assert "(2 messages)" in stderr.until("the conversation so far is kept")
            chat.stdin.write("once more\n")
            chat.stdin.close()
            assert "prompt" in stderr.until("tok/s")
            assert chat.wait(timeout=60) == 0
        finally:
            if chat.poll() is None:
                chat.kill()
    assert "Traceback" not in "".join(stderr.seen)
