"""``GET /v1/conversations/{conversation_id}/turns``: a conversation's turns, oldest first.

The web page reads it to show a conversation again after a reload. Like every
API read, it only sees the key owner's conversations: another owner's id is
simply an empty conversation.
"""

from __future__ import annotations

from aiohttp import web

from bot.channels.api import CHANNEL
from bot.channels.api.auth import authenticate_chat
from bot.channels.api.documents import turn_document
from bot.http.keys import READ_SESSIONS
from bot.storage.queries import recent_turns

MAX_TURNS = 200
"""The newest turns returned; the page has no use for a longer scroll-back."""


async def conversation_turns(request: web.Request) -> web.Response:
    principal = await authenticate_chat(request)
    if isinstance(principal, web.Response):
        return principal
    key = request.match_info["conversation_id"]
    async with request.app[READ_SESSIONS]() as session:
        turns = await recent_turns(
            session,
            owner=principal.owner,
            channel=CHANNEL.name,
            conversation_key=key,
            limit=MAX_TURNS,
        )
    return web.json_response(
        {
            "conversation_id": key,
            "owner": principal.owner,
            "turns": [turn_document(t, key) for t in turns],
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/conversations/{conversation_id}/turns", conversation_turns)
