"""Server-Sent Events framing over an aiohttp ``StreamResponse``, and the pump that feeds it.

The pump writes a stream's events until its last one, with a comment line
every ``keepalive_s`` while nothing happens (a turn waiting in a queue):
proxies and load balancers cut connections that stay silent for long (nginx's
``proxy_read_timeout`` is 60 s by default). It stops at once when the client
is gone, whichever of its two signs comes first: a failed write, or the
``gone`` event set by ``bot.http.readers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
from aiohttp import web

from bot.turns.streams import StreamEvent

KEEPALIVE_COMMENT = b": keep-alive\n\n"


def event_stream_response() -> web.StreamResponse:
    return web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            # Reverse proxies (nginx) must not buffer the stream.
            "X-Accel-Buffering": "no",
        }
    )


def format_event(event_id: str, kind: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()


async def pump_events(
    response: web.StreamResponse,
    events: AsyncGenerator[StreamEvent, None],
    *,
    gone: asyncio.Event,
    keepalive_s: float,
) -> bool:
    """Write ``events`` to ``response``; True when the last one was written, False if the
    client left first. The event source is closed either way (its generator's cleanup runs)."""
    left = asyncio.ensure_future(gone.wait())
    pending: asyncio.Future[StreamEvent] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            waiting: set[asyncio.Future[Any]] = {pending, left}
            done, _ = await asyncio.wait(
                waiting, timeout=keepalive_s, return_when=asyncio.FIRST_COMPLETED
            )
            if left in done:
                return False
            if pending in done:
                try:
                    event = pending.result()
                except StopAsyncIteration:
                    return True
                finally:
                    pending = None
                chunk = format_event(event.event_id, event.kind, event.data)
            else:
                chunk = KEEPALIVE_COMMENT
            try:
                await response.write(chunk)
            except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                return False
    finally:
        for future in (pending, left):
            if future is not None and not future.done():
                future.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await future
        await events.aclose()


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    """An event stream, its headers sent (for channels that write their own events)."""
    response = event_stream_response()
    await response.prepare(request)
    return response
