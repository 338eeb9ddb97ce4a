"""A turn's events as Server-Sent Events, for every API route that can answer with a stream.

Each stream holds one of its API key's reader slots (``server.max_streams_per_key``):
over the cap the request gets 429 before anything is stored.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from bot.apikeys import Principal
from bot.http.errors import json_error
from bot.http.keys import SERVER, STREAM_READERS, TURN_FOLLOWERS
from bot.http.readers import StreamSlot
from bot.http.sse import event_stream_response, pump_events


def wants_event_stream(request: web.Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


def reserve_stream(request: web.Request, principal: Principal) -> StreamSlot | web.Response:
    readers = request.app[STREAM_READERS]
    slot = readers.reserve(principal.key_id, request)
    if slot is None:
        return json_error(
            429,
            "rate_limited",
            f"this API key has {readers.open_for(principal.key_id)} event streams open; "
            f"the limit is {readers.max_per_key}: close one (or read with GET /v1/turns/{{id}})",
            limit="server.max_streams_per_key",
        )
    return slot


async def stream_turn(
    request: web.Request, turn_id: str, offset: int, slot: StreamSlot
) -> web.StreamResponse:
    """Stream the turn's events from ``offset``; the slot is released when the stream ends.

    A reader who left (before the headers, mid-stream or before the end) ends the
    handler quietly: the turn goes on and can be read again with Last-Event-ID.
    """
    response = event_stream_response()
    try:
        await response.prepare(request)
        finished = await pump_events(
            response,
            request.app[TURN_FOLLOWERS].follow(turn_id, offset),
            gone=slot.gone,
            keepalive_s=request.app[SERVER].sse_keepalive_s,
        )
        if finished:
            await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
    finally:
        slot.release()
    return response
