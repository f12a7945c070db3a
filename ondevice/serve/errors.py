"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the right status.

Any failure a client can cause is an `ApiError`; the handlers below turn it, Starlette's own 404/405
and anything unexpected (500; uvicorn logs the traceback) into that JSON, so the server stays up.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
         413: "invalid_request_error", 429: "rate_limit_error", 503: "server_unavailable", 500: "server_error"}  # fmt: skip


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
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


async def on_unexpected(request: Request, err: Exception) -> JSONResponse:
    """A bug: the client gets a 500 in the same shape; the server logs the traceback and stays up."""
    return ApiError(500, f"internal error: {type(err).__name__}: {err}").response()


HANDLERS = {ApiError: on_api_error, HTTPException: on_http_error, Exception: on_unexpected}
