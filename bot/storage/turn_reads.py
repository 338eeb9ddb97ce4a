"""A turn read by its id: whole, with its owner checked, or a conversation's newest turns.

Each function takes the session it runs in.
"""

from __future__ import annotations

from sqlalchemy import String, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.storage.models import Conversation, Turn


async def get_turn(session: AsyncSession, turn_id: str) -> Turn | None:
    return await session.get(Turn, turn_id)


async def get_turn_for_owner(
    session: AsyncSession, turn_id: str, owner: str
) -> tuple[Turn, str] | None:
    """A turn and its conversation's external key, only if the conversation belongs to
    ``owner`` (else None: 404, not 403)."""
    row = (
        await session.execute(
            select(Turn, Conversation.external_key)
            .join(Conversation, Conversation.id == Turn.conversation_id)
            .where(Turn.id == turn_id, Conversation.owner == owner)
        )
    ).one_or_none()
    return None if row is None else (row[0], row[1] or "")


_OWNED_TURN = (
    select(Turn.id)
    .join(Conversation, Conversation.id == Turn.conversation_id)
    .where(
        Turn.id == bindparam("turn_id", type_=String),
        Conversation.owner == bindparam("owner", type_=String),
    )
)
"""Whether a turn is the owner's; built once (every event stream a client opens runs it)."""


async def owned_turn_id(session: AsyncSession, turn_id: str, owner: str) -> str | None:
    """``turn_id`` if its conversation belongs to ``owner``, else None (a 404, not a 403).

    What an event stream or a cancel needs before it goes on; lighter than
    ``get_turn_for_owner``, which loads the whole row.
    """
    found = await session.execute(_OWNED_TURN, {"turn_id": turn_id, "owner": owner})
    return turn_id if found.first() is not None else None


async def recent_turns(session: AsyncSession, conversation_id: str, *, limit: int) -> list[Turn]:
    """The newest ``limit`` turns of a conversation, oldest first."""
    newest = await session.scalars(
        select(Turn)
        .where(Turn.conversation_id == conversation_id)
        .order_by(Turn.seq.desc())
        .limit(limit)
    )
    return list(reversed(newest.all()))
