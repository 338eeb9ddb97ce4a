"""Server-Sent Events framing over an aiohttp ``StreamResponse``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from typing import Any

from aiohttp import web

from bot.turns.streams import StreamEvent


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            # Reverse proxies (nginx) must not buffer the stream.
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


def format_event(event_id: str, kind: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()


async def send_events(
    request: web.Request, events: AsyncIterable[StreamEvent]
) -> web.StreamResponse:
    response = await open_event_stream(request)
    async for event in events:
        await response.write(format_event(event.event_id, event.kind, event.data))
    await response.write_eof()
    return response
