"""``GET /v1/conversations/{conversation_id}/turns``: a conversation's turns, oldest first.

The web page reads it to show a conversation again after a reload. Like every
API read, it only sees the key owner's conversations: another owner's id is
simply an empty conversation.
"""

from __future__ import annotations

from aiohttp import web
from sqlalchemy import select

from bot.channels.api.auth import authenticate_chat
from bot.channels.api.routes import API_CHANNEL, turn_document
from bot.http.keys import READ_SESSIONS
from bot.storage.models import Conversation, Turn

MAX_TURNS = 200
"""The newest turns returned; the page has no use for a longer scroll-back."""


async def conversation_turns(request: web.Request) -> web.Response:
    principal = await authenticate_chat(request)
    if isinstance(principal, web.Response):
        return principal
    key = request.match_info["conversation_id"]
    async with request.app[READ_SESSIONS]() as session:
        found = (
            await session.execute(
                select(Conversation.id, Conversation.persona).where(
                    Conversation.owner == principal.owner,
                    Conversation.channel == API_CHANNEL,
                    Conversation.external_key == key,
                    Conversation.closed_at.is_(None),
                )
            )
        ).one_or_none()
        conversation_id, persona = found if found is not None else (None, None)
        turns: list[Turn] = []
        if conversation_id is not None:
            newest = await session.scalars(
                select(Turn)
                .where(Turn.conversation_id == conversation_id)
                .order_by(Turn.seq.desc())
                .limit(MAX_TURNS)
            )
            turns = list(reversed(newest.all()))
    return web.json_response(
        {
            "conversation_id": key,
            "owner": principal.owner,
            # null: the default system prompt (or no conversation yet).
            "persona": persona,
            "turns": [turn_document(t, key) for t in turns],
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/conversations/{conversation_id}/turns", conversation_turns)
