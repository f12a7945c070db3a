"""A worker lost mid-answer: one line naming it, then the process ends; never a hang.

llama.cpp's RPC client has no error path: a worker that dies or drops the connection makes it call
GGML_ABORT ("Remote RPC server crashed or returned malformed response"), which aborts the process.
ggml lets a program see the message first (`ggml_set_abort_callback`); this one flushes the answer
so far, finds which worker stopped answering (a TCP connect is refused by a dead worker and
accepted, into the listen queue, by a live one busy serving us) and ends the process with one line
and exit code 3 instead of a core dump. Other aborts print their message as ggml would, then abort.

A worker that vanishes without closing its connection (a machine powered off, a cable pulled) would
leave the client waiting forever for bytes that never come: `harden` turns on TCP keepalive and a
user timeout on the client's connections, so such a connection fails within ~WORKER_TIMEOUT_S.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys

from ondevice.rpc import library

WORKER_LOST_EXIT = 3
CHILD_ENV = "ONDEVICE_RPC_CHILD"  # set in a chat's or server's child process: its parent loads again (supervise.py)
WORKER_TIMEOUT_S = 20  # unacknowledged data, or silence on an idle connection, for this long: the worker is gone
RPC_MESSAGES = ("RPC", "Failed to connect", "handshake")
_AbortCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_installed: dict[str, object] = {}


def lost_workers(endpoints, timeout: float = 1.0) -> list[str]:
    """The endpoints that refuse (or do not answer) a TCP connection now."""
    lost = []
    for e in endpoints:
        host, port = library.parse_endpoint(e)
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError:
            lost.append(e)
    return lost


def worker_lost_line(lost: list[str], endpoints) -> str:
    who = ", ".join(lost) if lost else "at " + ", ".join(endpoints) + " (which one is not known: all accept connections)"
    then = "" if os.environ.get(CHILD_ENV) == "1" else " Restart the worker, or run without it (drop it from --rpc)."
    return f"ondevice: worker {who} stopped answering mid-answer; the answer ends here.{then}"


def install_abort_handler(endpoints) -> None:
    """From now on an RPC abort in llama.cpp ends the process with worker_lost_line (once per process)."""
    _installed["endpoints"] = tuple(dict.fromkeys([*_installed.get("endpoints", ()), *endpoints]))
    if "callback" in _installed:
        return

    @_AbortCallback
    def on_abort(message):
        text = (message or b"").decode(errors="replace")
        if not any(m in text for m in RPC_MESSAGES):
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
            return  # ggml aborts as it would have
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - a closed stdout must not keep the line below from printing
            pass
        endpoints = _installed["endpoints"]
        sys.stderr.write(worker_lost_line(lost_workers(endpoints), endpoints) + "\n")
        sys.stderr.flush()
        os._exit(WORKER_LOST_EXIT)

    base = ctypes.CDLL(str(library.lib_path("libggml-base")))
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    base.ggml_set_abort_callback.argtypes = [_AbortCallback]
    base.ggml_set_abort_callback(on_abort)
    _installed["callback"] = on_abort  # kept alive for the process


def harden(fd: int) -> None:
    """Keepalive probes and a user timeout on one of llama.cpp's worker connections (Linux)."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 5), ("TCP_USER_TIMEOUT", WORKER_TIMEOUT_S * 1000)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    finally:
        sock.close()  # closes the duplicate; llama.cpp's descriptor stays open
