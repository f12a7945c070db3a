"""Refuse request bodies over a size limit (413) before they are buffered: an ASGI middleware."""

from __future__ import annotations

from ondevice.serve.errors import ApiError


class BodyLimit:
    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def too_large(self) -> ApiError:
        return ApiError(413, f"the request body is over the server's limit of {self.max_bytes:,} bytes.", code="request_too_large")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = self.too_large().response()
            response.headers["Connection"] = "close"
            return await response(scope, receive, send)
        received = 0

        async def limited_receive():  # a body sent in chunks (no length given) is counted as it comes
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise self.too_large()
            return message

        await self.app(scope, limited_receive, send)
