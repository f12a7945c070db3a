"""What a target split over RPC sends and receives per pass, read from the kernel's TCP counters.

llama.cpp keeps one TCP connection per worker. `WorkerLinks` finds them among this process's
sockets (by the worker's address) and reads `TCP_INFO` (linux/tcp.h, struct tcp_info) on each:
bytes acknowledged by the worker (sent), bytes received, and data segments each way. A pass's
traffic is the difference across it. A request's round trips are not visible here (a reply may span
several segments), but which workers answered is: `round_trips_per_pass` counts, per pass, the
workers that sent data back. llama.cpp's client waits for each worker's graph computation in turn,
one answered request per worker a pass (rpc/wiretap.py, which parses the requests, counted exactly
one per worker on every decode pass; the load's first pass also allocates and sends weights).
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

import numpy as np
import psutil

TCP_INFO_LEN = 232
MAX_PASSES = 4096
# offsets in struct tcp_info (linux/tcp.h): u64 bytes_acked @120, bytes_received @128; u32 data_segs_in @152, data_segs_out @156
_FIELDS = (("bytes_sent", 120, "Q"), ("bytes_received", 128, "Q"), ("segments_in", 152, "I"), ("segments_out", 156, "I"))


@dataclass(frozen=True)
class Traffic:
    bytes_sent: int = 0
    bytes_received: int = 0
    segments_in: int = 0
    segments_out: int = 0

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def __sub__(self, other: "Traffic") -> "Traffic":
        return Traffic(*(a - b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[int, int, int, int]:
        return (self.bytes_sent, self.bytes_received, self.segments_in, self.segments_out)


def tcp_traffic(fd: int) -> Traffic:
    sock = socket.socket(fileno=os.dup(fd))
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    finally:
        sock.close()
    if len(info) < 160:
        return Traffic()
    return Traffic(*(struct.unpack_from("<" + kind, info, off)[0] for _, off, kind in _FIELDS))


def _addresses(endpoint: str) -> set[tuple[str, int]]:
    host, _, port = endpoint.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {(info[4][0], int(port)) for info in infos}


def worker_fds(endpoints) -> dict[str, list[int]]:
    """This process's established TCP connections to each worker (file descriptors)."""
    wanted = {addr: e for e in endpoints for addr in _addresses(e)}
    found: dict[str, list[int]] = {e: [] for e in endpoints}
    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.raddr and conn.status == psutil.CONN_ESTABLISHED and conn.fd >= 0:
            e = wanted.get((conn.raddr.ip, conn.raddr.port))
            if e is not None:
                found[e].append(conn.fd)
    return found


class WorkerLinks:
    """The connections to the workers of one split: their traffic per pass, by the pass's tokens."""

    def __init__(self, endpoints):
        self.endpoints = tuple(endpoints)
        self.fds = worker_fds(self.endpoints)
        self.passes: list[tuple[int, Traffic, int]] = []  # (tokens, traffic, workers that answered) of each verification pass, the last MAX_PASSES
        self._start: dict[str, Traffic] | None = None

    def by_worker(self) -> dict[str, Traffic]:
        out = {}
        for endpoint, fds in self.fds.items():
            out[endpoint] = Traffic()
            for fd in fds:
                try:
                    out[endpoint] = out[endpoint] + tcp_traffic(fd)
                except OSError:
                    pass
        return out

    def pass_starts(self) -> None:
        self._start = self.by_worker()

    def pass_ends(self, tokens: int) -> None:
        if self._start is not None:
            deltas = {e: t - self._start.get(e, Traffic()) for e, t in self.by_worker().items()}
            answered = sum(1 for t in deltas.values() if t.segments_in > 0)
            self.passes = self.passes[-(MAX_PASSES - 1):] + [(tokens, sum(deltas.values(), Traffic()), answered)]
            self._start = None

    def summary(self) -> dict:
        """Mean bytes and segments per pass, and the bytes of a pass as fixed + per token (least
        squares over the passes seen: the profile's passes of 1 to 64 tokens, then the answers')."""
        if not self.passes:
            return {"verify_passes": 0}
        n = len(self.passes)
        tokens = np.array([t for t, _, _ in self.passes], float)
        received = np.array([tr.bytes_received for _, tr, _ in self.passes], float)
        sent = np.array([tr.bytes_sent for _, tr, _ in self.passes], float)
        out = {"verify_passes": n, "mean_tokens_per_pass": float(tokens.mean()),
               "bytes_sent_per_pass": float(sent.mean()), "bytes_received_per_pass": float(received.mean()),
               "segments_in_per_pass": sum(tr.segments_in for _, tr, _ in self.passes) / n,
               "segments_out_per_pass": sum(tr.segments_out for _, tr, _ in self.passes) / n,
               "round_trips_per_pass": sum(answered for _, _, answered in self.passes) / n}
        if len(set(tokens)) > 1:
            for name, y in (("received", received), ("sent", sent)):
                slope, fixed = np.polyfit(tokens, y, 1)
                out[f"bytes_{name}_fixed"], out[f"bytes_{name}_per_token"] = float(fixed), float(slope)
        return out
