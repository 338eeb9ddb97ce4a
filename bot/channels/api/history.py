"""``GET /v1/conversations/{conversation_id}/turns``: a conversation's turns, oldest first.

The turns of the active branch of the history tree (``bot.turns.branching``):
a regenerated reply or an edited message hides the turn it replaced, which is
still listed, by id, in ``alternatives`` of the turn that replaced it (each
turn of the same point of the tree, oldest first; empty when there is one),
so a client can show "2/3" and switch with ``POST /v1/turns/{id}/activate``.

The web page reads it to show a conversation again after a reload. Like every
API read, it only sees the key owner's conversations: another owner's id is
simply an empty conversation.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from sqlalchemy import select

from bot.channels.api.auth import authenticate_chat
from bot.channels.api.routes import API_CHANNEL, turn_document
from bot.http.keys import READ_SESSIONS
from bot.storage.models import Conversation, Turn
from bot.turns.branching import tree_view

MAX_TURNS = 200
"""The newest turns returned; the page has no use for a longer scroll-back."""


async def conversation_turns(request: web.Request) -> web.Response:
    principal = await authenticate_chat(request)
    if isinstance(principal, web.Response):
        return principal
    key = request.match_info["conversation_id"]
    async with request.app[READ_SESSIONS]() as session:
        conversation_id = await session.scalar(
            select(Conversation.id).where(
                Conversation.owner == principal.owner,
                Conversation.channel == API_CHANNEL,
                Conversation.external_key == key,
                Conversation.closed_at.is_(None),
            )
        )
        documents: list[dict[str, Any]] = []
        conversation = await session.get(Conversation, conversation_id) if conversation_id else None
        if conversation is not None:
            newest = await session.scalars(
                select(Turn)
                .where(Turn.conversation_id == conversation.id)
                .order_by(Turn.seq.desc())
                .limit(MAX_TURNS)
            )
            turns = list(reversed(newest.all()))
            view = await tree_view(session, conversation, turns)
            attempts: dict[str, int] = {}
            for turn in turns:
                root = turn.regenerates_turn_id or turn.id
                attempts[root] = max(attempts.get(root, 1), turn.attempt)
            for turn in turns:
                if turn.id not in view.active:
                    continue
                document = turn_document(
                    turn, key, attempts=attempts[turn.regenerates_turn_id or turn.id]
                )
                document["alternatives"] = view.alternatives.get(turn.id, [])
                documents.append(document)
    return web.json_response({"conversation_id": key, "owner": principal.owner, "turns": documents})


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/conversations/{conversation_id}/turns", conversation_turns)
