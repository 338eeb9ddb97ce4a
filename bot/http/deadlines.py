"""Slow clients are cut off: a request's head and its body each have a deadline.

aiohttp waits for a request's line and headers for as long as its keep-alive
timeout (3,630 s by default) and for a body for as long as the handler reads
it, so a client sending one byte every 30 s could hold a connection, and a
handler, for an hour. Here:

* **Head**: the request line and headers must be complete within
  ``server.header_timeout_s`` of the connection opening (or, on a kept-alive
  connection, of the previous response). aiohttp's keep-alive timer already
  closes an idle connection at that moment; a connection that has sent part of
  a request head is first answered ``408 Request Timeout``. The same number is
  therefore also how long an idle keep-alive connection stays open.
* **Body**: ``read_body`` reads the whole body within ``server.body_timeout_s``
  of the handler asking for it, else 408 (``bot.http.body``). After any answer
  that leaves part of a body unread (408, 401, 413), aiohttp keeps reading and
  discarding it for at most ``LINGERING_S`` so that the client can read the
  answer before the connection closes; then it closes.

Neither deadline is extended by trickled bytes: they count from a fixed start.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from bot.http.settings import ServerSettings

# aiohttp's default is 10 s; a client that is still sending after its answer went
# out gets this long to stop before the connection closes under it.
LINGERING_S = 5.0

_TIMEOUT_BODY = json.dumps(
    {"error": "timeout", "reason": "the request head did not arrive in time"}
).encode()
REQUEST_HEAD_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: application/json; charset=utf-8\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


class _HeadDeadlineHandler(RequestHandler):
    """aiohttp's connection handler, answering 408 when it closes on a half-sent request head."""

    __slots__ = ("_head_started",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_started = False

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Waiting for a request (no handler running) and bytes came: a head is on its way.
        waiter = self._waiter
        self._head_started = bool(data) and waiter is not None and not waiter.done()

    def _process_keepalive(self) -> None:
        waiter = self._waiter
        if (
            self._head_started
            and not self._force_close
            and self._keepalive
            and waiter is not None
            and not waiter.done()
            and self._loop.time() >= self._next_keepalive_close_time
            and self.transport is not None
        ):
            self.transport.write(REQUEST_HEAD_TIMEOUT_RESPONSE)
        super()._process_keepalive()


class _HeadDeadlineServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _HeadDeadlineHandler(self, loop=self._loop, **self._kwargs)


class DeadlineAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections have a request-head deadline.

    Built with ``keepalive_timeout=server.header_timeout_s`` (``app_runner``).
    """

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp builds its Server inside the Application; only the handler
        # factory differs, so the instance is given the subclass that has it.
        server.__class__ = _HeadDeadlineServer
        return server


def app_runner(app: web.Application, server: ServerSettings, **kwargs: Any) -> web.AppRunner:
    """The runner ``botctl serve`` uses: aiohttp's, with the slow-client deadlines."""
    return DeadlineAppRunner(
        app, keepalive_timeout=server.header_timeout_s, lingering_time=LINGERING_S, **kwargs
    )
