"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the right status.

Any failure a client can cause is an `ApiError`; the handlers below turn it, Starlette's own 404/405
and anything unexpected (500; uvicorn logs the traceback) into that JSON, so the server stays up. A
client that leaves before its request body has arrived (a slow upload cut at the read deadline, a
closed connection) is one line in the log, not a traceback: nobody is left to answer.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
         413: "invalid_request_error", 429: "rate_limit_error", 503: "server_unavailable", 500: "server_error"}  # fmt: skip


MAX_MESSAGE_CHARS = 2000  # a message quoting a template's error or a field is cut here


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        if len(message) > MAX_MESSAGE_CHARS:
            message = f"{message[:MAX_MESSAGE_CHARS]}… ({len(message) - MAX_MESSAGE_CHARS:,} more characters)"
        message = message.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate quoted from the request: "?"
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        kind = TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


async def on_api_error(request: Request, err: ApiError) -> JSONResponse:
    return err.response()


async def on_http_error(request: Request, err: HTTPException) -> JSONResponse:
    """Starlette's own errors (no such route, wrong method) in the same shape."""
    message = {404: f"no route {request.url.path}; see GET /v1/models", 405: f"{request.method} is not allowed on {request.url.path}"}
    return ApiError(err.status_code, message.get(err.status_code, str(err.detail)), code=None).response()


async def on_disconnect(request: Request, err: ClientDisconnect) -> Response:
    """The client went away while its request body was being read: one log line, no answer to send."""
    client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
    logging.getLogger("uvicorn.error").info("%s left before its request body arrived (%s %s); not answered", client, request.method,
                                            request.url.path[:200])
    return Response(status_code=499)  # 499: client closed request (never sent: the connection is gone)


async def on_unexpected(request: Request, err: Exception) -> JSONResponse:
    """A bug: the client gets a 500 in the same shape; the server logs the traceback and stays up."""
    return ApiError(500, f"internal error: {type(err).__name__}: {err}").response()


HANDLERS = {ApiError: on_api_error, HTTPException: on_http_error, ClientDisconnect: on_disconnect, Exception: on_unexpected}
