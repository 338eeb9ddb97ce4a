"""Turns as the API shows them: one (``GET /v1/turns/{id}``) or a conversation's, oldest
first (``GET /v1/conversations/{conversation_id}/turns``).

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

from bot.apikeys import Principal
from bot.channels.api.kind import API
from bot.errors import USER_MESSAGES, ErrorClass
from bot.http.key_gate import Scope, requires
from bot.http.keys import READ_SESSIONS
from bot.storage.conversations import find_open_conversation
from bot.storage.models import Turn
from bot.storage.turn_reads import recent_turns
from bot.turns.branching import tree_view
from bot.turns.ending import usage
from bot.turns.status import shown_status

MAX_TURNS = 200
"""The newest turns returned; the page has no use for a longer scroll-back."""


def public_error(error_class: str | None) -> str | None:
    """What a client is told of a failed turn: its class's message.

    Never the stored ``error_message``: that is for the log and the operator, and
    may name internal hosts or carry an exception's text.
    """
    if error_class is None:
        return None
    known = {member.value: member for member in ErrorClass}
    return USER_MESSAGES[known.get(error_class, ErrorClass.INTERNAL)]


def turn_document(turn: Turn, conversation_key: str, *, attempts: int = 1) -> dict[str, Any]:
    layer_ms = dict(turn.layer_ms or {})
    return {
        "turn_id": turn.id,
        "conversation_id": conversation_key,
        "status": shown_status(turn.status, turn.error_class),
        "text": turn.user_text,
        "reply": turn.reply_text,
        "usage": usage(turn.prompt_tokens, turn.cached_tokens, turn.completion_tokens),
        "finish_reason": turn.finish_reason,
        "error_class": turn.error_class,
        "error": public_error(turn.error_class),
        "timings_ms": layer_ms,
        "coalesced_into": turn.coalesced_into,
        "compaction_id": turn.compaction_id,
        "attempt": turn.attempt,
        "attempts": max(attempts, turn.attempt),
        "regenerates_turn_id": turn.regenerates_turn_id,
        "edits_turn_id": turn.edits_turn_id,
        "continues_turn_id": turn.continues_turn_id,
        "created_at": turn.created_at.isoformat(),
    }


@requires(Scope.CHAT)
async def conversation_turns(request: web.Request, principal: Principal) -> web.Response:
    key = request.match_info["conversation_id"]
    async with request.app[READ_SESSIONS]() as session:
        found = await find_open_conversation(
            session, owner=principal.owner, channel=API.name, external_key=key
        )
        documents: list[dict[str, Any]] = []
        if found is not None:
            turns = await recent_turns(session, found.id, limit=MAX_TURNS)
            view = await tree_view(session, found, turns)
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
    return web.json_response(
        {
            "conversation_id": key,
            "owner": principal.owner,
            # null: the default system prompt (or no conversation yet).
            "persona": found.persona if found is not None else None,
            "turns": documents,
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/conversations/{conversation_id}/turns", conversation_turns)
