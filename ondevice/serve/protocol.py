"""uvicorn's HTTP/1.1 protocol (h11) with the read deadlines it lacks, and a close that lets a client
read its error.

uvicorn closes an idle keep-alive connection after `timeout_keep_alive`, but it waits forever for a
request to arrive: 30 clients sending their headers a byte at a time, a body promised at 1,000 bytes
and never sent, 300 connections that send nothing — none was ever closed. Here a connection gets
`header_seconds` from its start (or from the end of its previous response) to deliver a request's
headers, then `body_seconds` for its body; past either it is closed (a 408 first when the app has
not answered). At shutdown a connection still sending its request is closed at once, so a stalled
upload cannot hold the server up.

A response that ends a connection before its request body was read (a 413 for a body over the
limit, a 408) would be lost: closing a socket with unread data makes the kernel send a reset, and the
client, still sending, sees ConnectionResetError instead of the answer. So such a close is a
*lingering close*, as nginx and Apache do it: the answer is sent, the write side shut, and what the
client still sends is read and dropped (up to `LINGER_BYTES`, for up to `LINGER_SECONDS`) until it
stops; then the connection closes.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_SECONDS = 5.0
LINGER_BYTES = 64 << 20
TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s")
TIMEOUT_BODY = b'{"error": {"message": "the request did not arrive in time.", "type": "invalid_request_error", "param": null, "code": "request_timeout"}}'


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: close() lingers while the request is unread."""

    def __init__(self, transport: asyncio.Transport, protocol: "GuardedH11Protocol"):
        self._transport, self._protocol = transport, protocol

    def __getattr__(self, name: str):
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.linger_or_close()


class GuardedH11Protocol(H11Protocol):
    header_seconds = 10.0
    body_seconds = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw_transport = transport
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # "headers" or "body": what the deadline is for
        self._lingering, self._dropped = False, 0
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._expect("headers")

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the answer is out: what the client still sends is dropped
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self._raw_transport.close()
            return
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._expect(None)
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self.conn.their_state is h11.SEND_BODY and not (self.cycle and self.cycle.response_started):
            self._raw_transport.close()  # a request still arriving: nobody waits for it at shutdown
            return
        super().shutdown()

    # --- deadlines ------------------------------------------------------------------------------
    def _follow_request(self) -> None:
        """Arm the deadline for what the connection waits on now: a request's headers, its body, or nothing."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._expect("body")
        elif state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            self._expect("headers")
        else:
            self._expect(None)

    def _expect(self, what: str | None) -> None:
        if what == self._waiting_for:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_for = what
        seconds = {"headers": self.header_seconds, "body": self.body_seconds}.get(what)
        self._deadline = None if seconds is None else self.loop.call_later(seconds, self._too_slow)

    def _too_slow(self) -> None:
        self._deadline = None
        if self._raw_transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self._raw_transport.write(TIMEOUT_RESPONSE % (len(TIMEOUT_BODY), TIMEOUT_BODY))
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's receive() sees the client gone
            self.cycle.message_event.set()
        self.linger_or_close()

    # --- closing --------------------------------------------------------------------------------
    def linger_or_close(self) -> None:
        transport = self._raw_transport
        unread = self.conn.their_state is h11.SEND_BODY
        if not unread or self._lingering or transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        self._expect(None)
        transport.write_eof()  # the answer, then FIN: the client reads it once it stops sending
        self.loop.call_later(LINGER_SECONDS, transport.close)
