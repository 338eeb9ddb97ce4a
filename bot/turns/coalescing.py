"""Coalescing: messages that piled up while a reply was generating get one answer.

With ``chat.pending_messages = "coalesce"``, the turn that starts running
claims every other queued turn of its conversation: they end at once with
status ``done``, no reply of their own and ``coalesced_into`` naming the
answering turn, whose user entry holds all their texts in order. Their event
streams end with a ``done`` event that carries ``coalesced_into`` (follow that
turn for the reply). With ``one_by_one`` every message gets its own turn.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import String, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.storage.models import Turn, TurnStatus
from bot.turns.chat_format import user_content
from bot.turns.ending import TurnEnd, apply_to_row

SEPARATOR = "\n\n"
COALESCED = "coalesced"


_PENDING = (
    select(Turn)
    .where(
        Turn.conversation_id == bindparam("conversation_id", type_=String),
        Turn.status == TurnStatus.QUEUED,
        Turn.id != bindparam("answering_id", type_=String),
        # Edits and regenerations answer their own message, on their own branch.
        Turn.parent_seq.is_(None),
    )
    .order_by(Turn.seq)
    # Locked, so a concurrent cancel of one of them either lands first (and
    # PostgreSQL re-checks it is still queued) or waits and finds it done.
    .with_for_update()
)
"""The other queued turns a starting turn answers too; built once (every turn start)."""


async def claim_pending(session: AsyncSession, answering: Turn) -> list[Turn]:
    """Mark the conversation's other queued turns as answered by ``answering`` (caller commits)."""
    pending = (
        await session.scalars(
            _PENDING,
            {"conversation_id": answering.conversation_id, "answering_id": answering.id},
        )
    ).all()
    now = dt.datetime.now(dt.UTC)
    for turn in pending:
        apply_to_row(turn, coalesced_end(turn, answering.id), now=now)
        turn.started_at = now
    return list(pending)


def combined_content(answering: Turn, covered: Sequence[Turn]) -> str:
    """The user entry of the answering turn: every covered message, oldest first."""
    return SEPARATOR.join(user_content(t.user_text, t.user_name) for t in (answering, *covered))


def coalesced_end(covered: Turn, answering_id: str) -> TurnEnd:
    """How a covered turn ends: done, no reply of its own, pointing at the answering turn."""
    return TurnEnd(
        TurnStatus.DONE,
        prompt_tokens=0,
        cached_tokens=0,
        completion_tokens=0,
        finish_reason=COALESCED,
        coalesced_into=answering_id,
    )
