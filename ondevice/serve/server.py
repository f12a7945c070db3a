"""uvicorn's server with ondevice's shutdown, and the one call that runs the app.

Shutdown (Ctrl-C or SIGTERM): requests still waiting get a 503 at once, the answer being generated
gets `grace_seconds` to finish (a second Ctrl-C stops it at its next target pass), then the worker
leaves the engine. Unlike plain uvicorn the signal is not re-raised afterwards: `serve` returns
normally, so the caller frees the models.
"""

from __future__ import annotations

import socket

import uvicorn

from ondevice.errors import OndeviceError
from ondevice.serve.app import ServeConfig, create_app
from ondevice.serve.queue import GenerationQueue


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, queue: GenerationQueue):
        super().__init__(config)
        self.queue = queue

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:  # the second signal: stop the answer in progress too
            self.force_exit = True
            self.queue.cancel_running()
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        self.queue.stop_accepting(cancel_running=self.force_exit)
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


def serve(config: ServeConfig, sock: socket.socket, grace_seconds: float = 30) -> dict:
    """Answer requests on `sock` until Ctrl-C / SIGTERM; on return no generation is running. The
    queue's counts: answers finished / failed / cancelled, tokens generated."""
    app = create_app(config)
    host, port = sock.getsockname()[:2]
    server = Server(uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=grace_seconds), app.state.queue)
    try:
        server.run(sockets=[sock])
    finally:
        app.state.queue.close()
    return app.state.queue.snapshot()
