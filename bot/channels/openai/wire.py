"""Server-Sent Events the way OpenAI's APIs send them.

Chat completions send bare ``data:`` lines and end with ``data: [DONE]``; the
Responses API names each event (``event: response.output_text.delta``) and
repeats the name as ``type`` in the data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from bot.turns.service import TurnService

DONE_LINE = b"data: [DONE]\n\n"


def data_line(payload: dict[str, Any], event: str | None = None) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    prefix = f"event: {event}\n" if event else ""
    return f"{prefix}data: {data}\n\n".encode()


async def write(
    response: web.StreamResponse, payload: dict[str, Any], event: str | None = None
) -> None:
    await response.write(data_line(payload, event))


@contextlib.asynccontextmanager
async def stopping_on_disconnect(turns: TurnService, turn_id: str) -> AsyncIterator[None]:
    """A client that stops reading a stream (a "stop" button) stops its turn.

    aiohttp either fails the next write (``handler_cancellation`` off, as
    ``botctl serve`` runs) or cancels the handler (on): both stop the turn.
    """
    try:
        yield
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        await turns.cancel_turn(turn_id)
    except asyncio.CancelledError:
        await turns.cancel_turn(turn_id)
        raise
