"""A turn as the API shows it: ``GET /v1/turns/{id}`` and a conversation's history."""

from __future__ import annotations

from typing import Any

from bot.errors import USER_MESSAGES, ErrorClass
from bot.storage.models import Turn
from bot.turns.ending import usage


def public_error(error_class: str | None) -> str | None:
    """What a client is told of a failed turn: its class's message.

    Never the stored ``error_message``: that is for the log and the operator, and
    may name internal hosts or carry an exception's text.
    """
    if error_class is None:
        return None
    known = {member.value: member for member in ErrorClass}
    return USER_MESSAGES[known.get(error_class, ErrorClass.INTERNAL)]


def turn_document(turn: Turn, conversation_key: str) -> dict[str, Any]:
    layer_ms = dict(turn.layer_ms or {})
    return {
        "turn_id": turn.id,
        "conversation_id": conversation_key,
        "status": turn.status,
        "text": turn.user_text,
        "reply": turn.reply_text,
        "usage": usage(turn.prompt_tokens, turn.cached_tokens, turn.completion_tokens),
        "finish_reason": turn.finish_reason,
        "error_class": turn.error_class,
        "error": public_error(turn.error_class),
        "timings_ms": layer_ms,
        "coalesced_into": turn.coalesced_into,
        "compaction_id": turn.compaction_id,
        "created_at": turn.created_at.isoformat(),
    }
