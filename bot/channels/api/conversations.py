"""``GET /v1/conversations``: the key owner's API conversations, newest first, with titles.

The web page lists them to switch between. A title is the first words of a
conversation's first message (nothing is generated for it: no engine time, and
it never changes under the user). Only open conversations of the ``api``
channel are listed: the ones ``GET /v1/conversations/{id}/turns`` reads.

Pages: ``limit`` (1 to ``MAX_LIMIT``) conversations, and ``next_cursor`` when
there are more; passing it back as ``cursor`` reads the next page. A cursor is
opaque to clients; a malformed one is a 400.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Any

from aiohttp import web

from bot.apikeys import Principal
from bot.channels.api.kind import API
from bot.http.errors import json_error
from bot.http.key_gate import Scope, requires
from bot.http.keys import READ_SESSIONS
from bot.storage.conversation_list import ListedConversation, PagePosition, list_open_conversations

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
TITLE_WORDS = 8
TITLE_CHARS = 60
"""A title is at most this many words and characters: one line of a narrow list."""
CURSOR_MAX = 200
"""A cursor is an ISO time and a 32-character id, base64-encoded: far shorter than this."""
ELLIPSIS = "…"


def title_of(first_message: str | None) -> str | None:
    """The first words of ``first_message``, on one line; None for no message yet."""
    if first_message is None:
        return None
    words = first_message.split()
    title = " ".join(words[:TITLE_WORDS])
    cut = len(words) > TITLE_WORDS
    if len(title) > TITLE_CHARS:
        title = title[:TITLE_CHARS].rstrip()
        cut = True
    return title + ELLIPSIS if cut else title


def encode_cursor(position: PagePosition) -> str:
    raw = f"{position.updated_at.isoformat()}|{position.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> PagePosition | None:
    """The position ``cursor`` names, or None when it is not one this module wrote."""
    if len(cursor) > CURSOR_MAX or not cursor.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        when, separator, conversation_id = raw.partition("|")
        updated_at = dt.datetime.fromisoformat(when)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not separator or updated_at.tzinfo is None:
        return None
    if not conversation_id.isascii() or not conversation_id.isalnum():
        return None
    return PagePosition(updated_at.astimezone(dt.UTC), conversation_id)


def _limit(request: web.Request) -> int | None:
    text = request.query.get("limit")
    if text is None:
        return DEFAULT_LIMIT
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        return None
    return int(text)


def _document(conversation: ListedConversation) -> dict[str, Any]:
    return {
        "conversation_id": conversation.external_key,
        "title": title_of(conversation.first_message),
        "persona": conversation.persona,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
    }


@requires(Scope.CHAT)
async def list_conversations(request: web.Request, principal: Principal) -> web.Response:
    limit = _limit(request)
    if limit is None:
        return json_error(400, "bad_request", f"limit must be a whole number from 1 to {MAX_LIMIT}")
    after = None
    cursor = request.query.get("cursor")
    if cursor is not None:
        after = decode_cursor(cursor)
        if after is None:
            return json_error(400, "bad_request", "cursor: not a next_cursor this API gave")
    async with request.app[READ_SESSIONS]() as session:
        # One more than asked says whether another page follows.
        listed = await list_open_conversations(
            session, owner=principal.owner, channel=API.name, limit=limit + 1, after=after
        )
    page = listed[:limit]
    next_cursor = None
    if len(listed) > limit:
        last = page[-1]
        next_cursor = encode_cursor(PagePosition(last.updated_at, last.id))
    return web.json_response(
        {"conversations": [_document(item) for item in page], "next_cursor": next_cursor}
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/conversations", list_conversations)
