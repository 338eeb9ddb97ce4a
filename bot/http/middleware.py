"""Every request's context: arrival time, a request id in the log, JSON error bodies."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from bot.http.errors import json_error
from bot.http.keys import REQUEST_RECEIVED_AT, REQUEST_STARTED
from bot.http.storable import refuse_unstorable_path
from bot.storage.db import storage_unavailable

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HTTP_ERROR_MIN = 400
_HTTP_ERRORS = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
_KEPT_HEADERS = ("Allow", "Retry-After")


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stamp arrival time and bind a request id to every log line of this request.

    Every error answer is JSON ``{"error", "reason"}``: aiohttp's own (unknown
    path, wrong method) too. A path id no row can hold is refused here, for every
    route (``bot.http.storable``). An unexpected exception is a 500 that tells the
    client only the request id; its text and traceback go to the log under it.
    """
    request[REQUEST_STARTED] = time.perf_counter()
    request[REQUEST_RECEIVED_AT] = time.time()
    request_id = uuid.uuid4().hex[:16]
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    try:
        refused = refuse_unstorable_path(request)
        if refused is not None:
            return refused
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < HTTP_ERROR_MIN:
            raise
        response = json_error(exc.status, _HTTP_ERRORS.get(exc.status, "bad_request"), exc.reason)
        for name in _KEPT_HEADERS:
            if name in exc.headers:
                response.headers[name] = exc.headers[name]
        return response
    except Exception as exc:
        if storage_unavailable(exc):
            # Nothing was stored: Telegram, Slack and webhook senders redeliver on a
            # non-2xx answer, and a stored delivery is deduplicated, never answered twice.
            log.warning("storage_unavailable", path=request.path, error=type(exc).__name__)
            response = json_error(
                503, "unavailable", "the service cannot store messages right now; try again"
            )
            response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER_S)
            return response
        log.exception(
            "request_failed", method=request.method, path=request.path, request_id=request_id
        )
        return json_error(
            500,
            "internal",
            "internal error; the service log has the details",
            request_id=request_id,
        )


STORAGE_RETRY_AFTER_S = 1
