"""CORS: browser clients on other origins may call the API, when the operator lists them.

Off by default (``server.cors_origins = []``): a browser then lets only the
service's own page (same origin) read its answers. Each listed origin
(``https://chat.example.com``), or ``"*"`` for any, is allowed to call every
route with an ``Authorization`` header. Keys travel in that header, never in
cookies, so no credentials mode is needed, and ``"*"`` lets no site act as a
signed-in user: a page still needs a key to get anything.

Two parts, because answers stream: a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered by a middleware before any
handler; every other answer gets its headers in ``on_response_prepare``, the
one moment every response passes, including event streams that a handler
starts writing long before it returns.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import hdrs, web

from bot.http.middleware import Handler

ALLOWED_METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type, Accept, Last-Event-ID"
"""What the API's clients send: the key, JSON bodies, SSE, and a stream's resume point."""
EXPOSED_HEADERS = "Retry-After"
"""Readable by a script on the other origin: when to try again after a 429 or 503."""
PREFLIGHT_MAX_AGE_S = 600
ANY_ORIGIN = "*"


class CorsPolicy:
    def __init__(self, origins: Sequence[str]) -> None:
        self._any = ANY_ORIGIN in origins
        self._origins = frozenset(origin.rstrip("/") for origin in origins)

    def allowed(self, origin: str | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for ``origin``; None when not allowed."""
        if not origin:
            return None
        if self._any:
            return ANY_ORIGIN
        return origin if origin in self._origins else None

    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.method != hdrs.METH_OPTIONS
            or hdrs.ACCESS_CONTROL_REQUEST_METHOD not in request.headers
        ):
            return await handler(request)
        origin = self.allowed(request.headers.get(hdrs.ORIGIN))
        refused = request.match_info.http_exception
        # A preflight of a path that does not exist is that path's 404; any method of
        # one that does is answered here (its handler answers the real request).
        if origin is None or (refused is not None and refused.status != 405):
            return await handler(request)
        return web.Response(
            status=204,
            headers={
                hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin,
                hdrs.ACCESS_CONTROL_ALLOW_METHODS: ALLOWED_METHODS,
                hdrs.ACCESS_CONTROL_ALLOW_HEADERS: ALLOWED_HEADERS,
                hdrs.ACCESS_CONTROL_MAX_AGE: str(PREFLIGHT_MAX_AGE_S),
                hdrs.VARY: "Origin",
            },
        )

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        if hdrs.ACCESS_CONTROL_ALLOW_ORIGIN in response.headers:
            return  # the preflight's own answer
        origin = self.allowed(request.headers.get(hdrs.ORIGIN))
        if origin is None:
            return
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
        response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSED_HEADERS
        if origin != ANY_ORIGIN:
            # The answer differs by Origin: caches must keep one per origin.
            response.headers.add(hdrs.VARY, "Origin")


def setup(app: web.Application, origins: Sequence[str]) -> None:
    """Allow ``origins``; with none, add nothing at all."""
    if not origins:
        return
    policy = CorsPolicy(origins)
    app.middlewares.append(policy.preflight)
    app.on_response_prepare.append(policy.add_headers)
