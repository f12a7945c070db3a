"""A counting (and optionally delaying) relay between a split's client and one worker, for measuring.

    python -m ondevice.rpc.wiretap --listen 127.0.0.1:50062 --to 127.0.0.1:50052 --delay-ms 1 --out tap.json

The client then uses `--rpc 127.0.0.1:50062`. The relay parses llama.cpp's RPC requests
(| cmd: 1 byte | size: 8 bytes | payload |) and counts, per graph computation (one a pass per
worker), the requests the client waits on (those the server answers: ggml-rpc.cpp's
rpc_serve_client), the requests it does not, and the bytes each way. --delay-ms holds every chunk
that long in each direction (a round trip then takes twice that longer), the cheap stand-in for
`tc netem` where no network namespace can be made. On SIGTERM or SIGINT it writes --out (JSON):
one record per pass, and the totals. Not for use between real machines: it adds a hop.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import struct
import sys
import threading
import time

ANSWERED = {0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15}  # ALLOC_BUFFER … HELLO, DEVICE_COUNT: the server sends a reply
COMPUTE = {10, 16}  # GRAPH_COMPUTE, GRAPH_RECOMPUTE: a pass on this worker


class Tap:
    def __init__(self):
        self.lock = threading.Lock()
        self.passes: list[dict] = []
        self.current = self._fresh()
        self.totals = self._fresh()

    @staticmethod
    def _fresh() -> dict:
        return {"round_trips": 0, "one_way": 0, "bytes_to_worker": 0, "bytes_from_worker": 0}

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.current[key] += n
            self.totals[key] += n

    def request(self, cmd: int) -> None:
        with self.lock:
            key = "round_trips" if cmd in ANSWERED else "one_way"
            self.current[key] += 1
            self.totals[key] += 1
            if cmd in COMPUTE:  # a pass ends at its graph computation; its reply (the result) comes in the next record
                self.passes.append(self.current)
                self.current = self._fresh()


class RequestParser:
    """Follows the client's byte stream and reports each request's command byte."""

    def __init__(self, on_request):
        self.on_request, self.header, self.left = on_request, b"", 0

    def feed(self, data: bytes) -> None:
        i = 0
        while i < len(data):
            if self.left:
                take = min(self.left, len(data) - i)
                self.left -= take
                i += take
                continue
            need = 9 - len(self.header)
            self.header += data[i : i + need]
            i += min(need, len(data) - i)
            if len(self.header) == 9:
                cmd, size = struct.unpack("<BQ", self.header)
                self.on_request(cmd)
                self.header, self.left = b"", size


def pump(src: socket.socket, dst: socket.socket, tap: Tap, key: str, delay: float, parser=None) -> None:
    try:
        while data := src.recv(1 << 20):
            if parser is not None:
                parser.feed(data)
            tap.add(key, len(data))
            if delay:
                time.sleep(delay)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listen: str, to: str, delay_ms: float, tap: Tap) -> None:
    host, port = listen.rsplit(":", 1)
    srv = socket.create_server((host, int(port)))
    th, tp = to.rsplit(":", 1)
    while True:
        client, _ = srv.accept()
        worker = socket.create_connection((th, int(tp)))
        for s in (client, worker):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        d = delay_ms / 1000
        threading.Thread(target=pump, args=(client, worker, tap, "bytes_to_worker", d, RequestParser(tap.request)), daemon=True).start()
        threading.Thread(target=pump, args=(worker, client, tap, "bytes_from_worker", d), daemon=True).start()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="host:port the client connects to")
    ap.add_argument("--to", required=True, help="the worker's host:port")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added to every chunk, each direction")
    ap.add_argument("--out", required=True, help="JSON file written on SIGTERM/SIGINT")
    args = ap.parse_args(argv)
    tap = Tap()

    def finish(*_):
        with tap.lock:
            json.dump({"passes": tap.passes, "totals": tap.totals, "delay_ms": args.delay_ms}, open(args.out, "w"))
        sys.exit(0)

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    threading.Thread(target=serve, args=(args.listen, args.to, args.delay_ms, tap), daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
