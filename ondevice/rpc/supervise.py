"""`chat` and `serve` over workers outlive a lost one: the command runs in a child process, and when
a worker is lost the next request runs on a load without it.

llama.cpp's RPC client aborts its process when a worker stops answering (faults.py ends it with one
line and WORKER_LOST_EXIT). A one-shot command (`generate`, `bench`) ends there. A chat or a server
would lose everything, so with --rpc they run as a child of a small parent that waits for it: on
WORKER_LOST_EXIT the parent asks which workers still answer and starts the same command again with
`--rpc` naming only those (without `--rpc` when none is left: the target then lives on this machine
alone, in RAM or streamed from disk, as the memory plan decides; the new load says if it cannot).
A chat's conversation and /set settings survive in a state file the child writes after each answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ondevice.rpc.faults import CHILD_ENV, WORKER_LOST_EXIT, lost_workers

STATE_ENV = "ONDEVICE_CHAT_STATE"  # the chat's state file, kept across children


def is_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def with_workers(argv: list[str], endpoints: list[str]) -> list[str]:
    """argv with its --rpc replaced by these endpoints (dropped when there are none)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--rpc":
            skip = True
        elif not arg.startswith("--rpc="):
            out.append(arg)
    return out + (["--rpc", ",".join(endpoints)] if endpoints else [])


def supervise(argv: list[str], endpoints: list[str], say=print, keep_state: bool = False) -> int:
    """Run `ondevice ARGV` as a child until it ends for another reason than a lost worker; its exit code."""
    with tempfile.TemporaryDirectory(prefix="ondevice-chat-") as folder:
        env = {**os.environ, CHILD_ENV: "1"}
        if keep_state:
            env[STATE_ENV] = str(Path(folder) / "state.json")
        while True:
            code = run_child([sys.executable, "-m", "ondevice", *argv], env)
            if code != WORKER_LOST_EXIT:
                return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
            lost = lost_workers(endpoints)
            if not lost:  # which one is not known (faults.py said so): nothing to leave out
                return code
            endpoints = [e for e in endpoints if e not in lost]
            argv = with_workers(argv, endpoints)
            rest = f"the other workers ({', '.join(endpoints)})" if endpoints else "this machine alone"
            say(f"ondevice: loading again on {rest}, without {', '.join(lost)}.")


def run_child(command: list[str], env: dict) -> int:
    """The child's exit code; Ctrl-C is the child's to handle, SIGTERM is passed on to it."""
    child = subprocess.Popen(command, env=env)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to both of us
    old_term = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    try:
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


# --- the chat's state, in the child ----------------------------------------------------------------


def load_state() -> dict | None:
    """The conversation and settings a lost child left ({"history", "settings"}), or None."""
    path = os.environ.get(STATE_ENV)
    if not path or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text())


def save_state(history: list[dict], settings: dict) -> None:
    path = os.environ.get(STATE_ENV)
    if path:
        tmp = Path(path).with_suffix(".tmp")
        tmp.write_text(json.dumps({"history": history, "settings": settings}))
        os.replace(tmp, path)
