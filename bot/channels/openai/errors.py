"""Refusals and failures as OpenAI error objects: ``{"error": {"message", "type", "code"}}``.

``type`` is OpenAI's (clients branch on the HTTP status and on it); ``code``
is this service's error class (``bot.errors``), the same word the turn's
row, log line and metrics carry. OpenAI SDKs raise their own exception type
per status: 400 ``BadRequestError``, 401 ``AuthenticationError``, 403
``PermissionDeniedError``, 404 ``NotFoundError``, 409 ``ConflictError``, 429
``RateLimitError``, 5xx ``InternalServerError``.
"""

from __future__ import annotations

import enum
from typing import Any

from aiohttp import web

from bot.errors import ErrorClass
from bot.http.key_gate import Refusal, Scope, requires


class ErrorType(enum.StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    PERMISSION = "permission_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_error"
    SERVER = "server_error"


CONTEXT_LENGTH_CODE = "context_length_exceeded"
"""OpenAI's own code for a prompt over the context window; clients look for it."""

# How a failed turn is answered (the request was valid, the turn failed).
TURN_FAILURE_STATUS: dict[ErrorClass, int] = {
    ErrorClass.BAD_REQUEST: 400,
    ErrorClass.CONTEXT_OVERFLOW: 400,
    ErrorClass.RATE_LIMITED: 429,
    ErrorClass.ENGINE_UNAVAILABLE: 503,
    ErrorClass.OOM: 503,
    ErrorClass.NETWORK: 503,
    ErrorClass.TIMEOUT: 504,
}
DEFAULT_FAILURE_STATUS = 500

_TYPE_OF_STATUS = {
    400: ErrorType.INVALID_REQUEST,
    401: ErrorType.AUTHENTICATION,
    403: ErrorType.PERMISSION,
    404: ErrorType.NOT_FOUND,
    408: ErrorType.INVALID_REQUEST,
    409: ErrorType.INVALID_REQUEST,
    413: ErrorType.INVALID_REQUEST,
    429: ErrorType.RATE_LIMIT,
}


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    error_type = _TYPE_OF_STATUS.get(status, ErrorType.SERVER)
    return {"error": {"message": message, "type": error_type.value, "param": param, "code": code}}


def openai_error(
    status: int,
    message: str,
    code: str,
    *,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        error_body(status, message, code, param), status=status, headers=headers
    )


def turn_failure(error_class: ErrorClass, message: str) -> tuple[int, dict[str, Any]]:
    """Status and body for a turn that failed after it was accepted."""
    status = TURN_FAILURE_STATUS.get(error_class, DEFAULT_FAILURE_STATUS)
    code = CONTEXT_LENGTH_CODE if error_class == ErrorClass.CONTEXT_OVERFLOW else error_class.value
    return status, error_body(status, message, code)


class RequestRefused(Exception):
    """A request this API will not take; carries its OpenAI-style answer."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response


def openai_refusal(refusal: Refusal) -> web.Response:
    """The key gate's refusal (``bot.http.key_gate``) as an OpenAI error object."""
    return openai_error(refusal.status, refusal.reason, refusal.code.value)


chat_key = requires(Scope.CHAT, refuse=openai_refusal)
"""The gate of every OpenAI-compatible route: a key with the ``chat`` scope."""


def bad_request(message: str, param: str | None = None) -> RequestRefused:
    return RequestRefused(openai_error(400, message, ErrorClass.BAD_REQUEST.value, param=param))
