"""uvicorn's server with ondevice's shutdown, and the one call that runs the app.

Shutdown (Ctrl-C or SIGTERM): requests still waiting get a 503 at once, a chat template being
rendered is stopped, a request still being uploaded is dropped, the answer being generated gets
`grace_seconds` to finish (a second Ctrl-C stops it at its next target pass), then the worker
leaves the engine. Unlike plain uvicorn the signal is not re-raised afterwards: `serve` returns
normally, so the caller frees the models. Connections are held to read deadlines (protocol.py) and
to the limits below.
"""

from __future__ import annotations

import socket

import uvicorn

from ondevice.errors import OndeviceError
from ondevice.serve.app import ServeConfig, create_app
from ondevice.serve.protocol import GuardedH11Protocol
from ondevice.serve.queue import GenerationQueue

KEEP_ALIVE_SECONDS = 5  # an idle keep-alive connection is closed after this (uvicorn's default, said here)
MAX_CONNECTIONS = 256  # connections + requests in flight; past it uvicorn answers 503 (the queue holds 64)
MAX_HEADER_BYTES = 16 << 10  # a request's line and headers (h11's default, said here): past it a 400


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, queue: GenerationQueue, on_shutdown=lambda: None):
        super().__init__(config)
        self.queue = queue
        self.on_shutdown = on_shutdown  # stops prompt work (a template render) that would hold the shutdown up

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:  # the second signal: stop the answer in progress too
            self.force_exit = True
            self.queue.cancel_running()
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        self.queue.stop_accepting(cancel_running=self.force_exit)
        self.on_shutdown()
        await super().shutdown(sockets)


def bind(host: str, port: int) -> socket.socket:
    """The server's address, taken before the models load: a busy port fails at once, in one line."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OndeviceError(f"cannot listen on {host}:{port} ({err.strerror}); is another server there? Pick another --port.") from None
    return sock


def serve(config: ServeConfig, sock: socket.socket, grace_seconds: float = 30, read_seconds: float = 10) -> dict:
    """Answer requests on `sock` until Ctrl-C / SIGTERM; on return no generation is running. The
    queue's counts: answers finished / failed / cancelled, tokens generated. read_seconds: what a
    client gets to send a request's headers, and again its body (protocol.py)."""
    app = create_app(config)
    host, port = sock.getsockname()[:2]
    protocol = type("Protocol", (GuardedH11Protocol,), {"header_seconds": read_seconds, "body_seconds": read_seconds})
    server = Server(uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=grace_seconds, http=protocol,
                                   timeout_keep_alive=KEEP_ALIVE_SECONDS, limit_concurrency=MAX_CONNECTIONS,
                                   h11_max_incomplete_event_size=MAX_HEADER_BYTES),
                    app.state.queue, app.state.api.close)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.queue.close()
    return app.state.queue.snapshot()
