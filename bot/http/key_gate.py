"""The one gate for API keys: every route that takes a key is declared with the scope it needs.

``@requires(Scope.CHAT)`` (or ``Scope.ADMIN``) wraps a handler that takes the
caller (``bot.apikeys.Principal``) as its second argument. Before the handler
runs, the gate reads ``Authorization: Bearer <key>``, checks the key and
refuses with

* 401 ``auth``: no key, or an unknown, revoked or expired one;
* 403 ``forbidden``: a valid key without the scope.

Every chat route (the HTTP API's, the OpenAI-compatible ones) needs ``chat``;
the operator routes on the public port (``/metrics``) need ``admin``. How a
refusal is written is the route's: the HTTP API's ``{"error", "reason"}``
(``plain_refusal``), or OpenAI's error object. Routes that take no key are
listed in ``KEYLESS_ROUTES``, each with the reason; a test walks the app's route
table and fails on a route that is in neither, so a new route cannot forget.
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from bot.apikeys import Principal, authenticate
from bot.http.errors import json_error
from bot.http.keys import AUTH_MS, SHORT_READS


class Scope(enum.StrEnum):
    CHAT = "chat"
    """Conversations: sending messages, reading turns, the OpenAI-compatible API."""
    ADMIN = "admin"
    """Operators: ``/metrics`` on the public port."""


class RefusalCode(enum.StrEnum):
    AUTH = "auth"
    FORBIDDEN = "forbidden"
    BAD_REQUEST = "bad_request"


@dataclass(frozen=True)
class Refusal:
    """Why a request is not let through, before its handler runs."""

    status: int
    code: RefusalCode
    reason: str


RefusalWriter = Callable[[Refusal], web.Response]


def plain_refusal(refusal: Refusal) -> web.Response:
    """The HTTP API's shape: ``{"error": code, "reason": ...}``."""
    return json_error(refusal.status, refusal.code.value, refusal.reason)


@dataclass(frozen=True)
class Gate:
    """What a gated route needs, and how it answers a refusal."""

    scope: Scope
    refuse: RefusalWriter


Answer = TypeVar("Answer", bound=web.StreamResponse)
Handler = Callable[[web.Request], Awaitable[Answer]]
KeyedHandler = Callable[[web.Request, Principal], Awaitable[Answer]]

_GATES: dict[Callable[..., object], Gate] = {}
"""Every gated handler (the wrapper the router holds) and its gate."""

KEYLESS_ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/"): "the web page; it asks for a key in the browser",
    ("GET", "/static/{filename}"): "the web page's files",
    ("GET", "/healthz"): "liveness, for process supervisors",
    ("GET", "/readyz"): "readiness, for load balancers",
    ("GET", "/openapi.json"): "the API's own description",
    ("GET", "/favicon.ico"): "the browser's tab icon",
    ("POST", "/telegram/{bot_name}"): "Telegram's secret token header (telegram/routes.py)",
    ("POST", "/slack/events"): "Slack's request signature (slack/routes.py)",
    ("POST", "/slack/commands"): "Slack's request signature (slack/routes.py)",
    ("POST", "/webhooks/{name}"): "the integration's HMAC signature (webhook/routes.py)",
    ("POST", "/discord/{name}"): "Discord's Ed25519 signature (discord/routes.py)",
}
"""(method, path) of the routes that take no API key, and why: every other route is gated."""


def bearer_key(request: web.Request) -> str | None:
    """The key of ``Authorization: Bearer <key>``, or None."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


async def authenticate_request(request: web.Request, scope: Scope) -> Principal | Refusal:
    """The caller, or why they are refused: 401 without a valid key, 403 without ``scope``."""
    key = bearer_key(request)
    if key is None:
        return Refusal(401, RefusalCode.AUTH, "missing 'Authorization: Bearer <api key>' header")
    principal = await authenticate(request.config_dict[SHORT_READS], key)
    if principal is None:
        return Refusal(401, RefusalCode.AUTH, "unknown, revoked or expired API key")
    if scope.value not in principal.scopes:
        return Refusal(
            403, RefusalCode.FORBIDDEN, f"this endpoint needs a key with the {scope} scope"
        )
    return principal


def requires(
    scope: Scope, *, refuse: RefusalWriter = plain_refusal
) -> Callable[[KeyedHandler[Answer]], Handler[Answer | web.Response]]:
    """Gate a handler ``(request, principal)`` behind a key with ``scope``."""

    def wrap(handler: KeyedHandler[Answer]) -> Handler[Answer | web.Response]:
        @functools.wraps(handler)
        async def gated(request: web.Request) -> Answer | web.Response:
            started = time.perf_counter()
            found = await authenticate_request(request, scope)
            request[AUTH_MS] = (time.perf_counter() - started) * 1000
            if isinstance(found, Refusal):
                return refuse(found)
            return await handler(request, found)

        _GATES[gated] = Gate(scope, refuse)
        return gated

    return wrap


def gate_of(handler: Callable[..., object]) -> Gate | None:
    """The gate of a routed handler; None for one that takes no key."""
    return _GATES.get(handler)
