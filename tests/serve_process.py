"""`ondevice serve` as a real subprocess on a free local port, and plain HTTP to it (for tests).

    with ServeProcess(["-m", "tiny", "--threads", "1"], env) as server:
        server.client().chat.completions.create(...)     # the official openai client
        server.call("POST", "/v1/chat/completions", b"{")  # raw HTTP: (status, JSON body)
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(self, args: list[str], env: dict[str, str], api_key: str | None = None):
        self.port = free_port()
        self.api_key = api_key
        self.args = ["serve", "--port", str(self.port), *args, *(["--api-key", api_key] if api_key else [])]
        self.env = {**os.environ, **env}
        self._log = tempfile.NamedTemporaryFile("w+", prefix="ondevice-serve-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> "ServeProcess":
        self.proc = subprocess.Popen([sys.executable, "-m", "ondevice", *self.args], env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ondevice serve exited with {self.proc.returncode}:\n{self._close_log()}")
            try:
                if self.call("GET", "/health")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"ondevice serve did not answer /health in {timeout} s:\n{self._close_log()}")

    def client(self, **options):
        import openai

        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key or "none", max_retries=0, **options)

    def call(self, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None, timeout: float = 120):
        """(status, parsed JSON body) of one raw HTTP request; the API key is sent unless headers say otherwise."""
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}), **(headers or {})}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers={k: v for k, v in sent.items() if v is not None})
            response = conn.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            conn.close()

    def health(self) -> dict:
        status, body = self.call("GET", "/health")
        assert status == 200, body
        return body

    def wait_queue(self, timeout: float = 30, **expected) -> dict:
        """Poll /health until its queue shows the expected counts (e.g. running=0, cancelled=2); the
        queue as it is then (or at the timeout: the caller's assert shows what differs)."""
        deadline = time.monotonic() + timeout
        while True:
            queue = self.health()["queue"]
            if all(queue[k] == v for k, v in expected.items()) or time.monotonic() > deadline:
                return queue
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        """Send `sig`, wait for the process to end; its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def log(self) -> str:
        self._log.flush()
        with open(self._log.name) as f:
            return f.read()

    def _close_log(self) -> str:
        """The log's text; the file is removed."""
        text = self.log()
        os.unlink(self._log.name)
        return text

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self._close_log()
