"""One owner's open conversations on one channel, newest first, a page at a time.

Pages are keyset pages on (``updated_at`` descending, ``id``): a page starts
after the last row of the one before, so a conversation that gets a new turn
while someone pages moves to the top instead of shifting every later page by
one, and no page re-reads the rows before it (an ``OFFSET`` would).

Each row carries the start of the conversation's first message (its turn of
the lowest ``seq``, read through the unique ``(conversation_id, seq)`` index),
cut in SQL so a long first message is not read whole for a title.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.functions import func

from bot.storage.models import Conversation, Turn, as_utc

FIRST_MESSAGE_CHARS = 200
"""How much of a conversation's first message is read: enough for a title's first words."""


@dataclass(frozen=True)
class ListedConversation:
    id: str
    """The internal id, which keyset pages order ties by; clients never see it."""
    external_key: str
    persona: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    first_message: str | None
    """The first ``FIRST_MESSAGE_CHARS`` characters of its first message; None before one."""


@dataclass(frozen=True)
class PagePosition:
    """Where the previous page ended: its last conversation's ``updated_at`` and id."""

    updated_at: dt.datetime
    id: str


async def list_open_conversations(
    session: AsyncSession,
    *,
    owner: str,
    channel: str,
    limit: int,
    after: PagePosition | None = None,
) -> list[ListedConversation]:
    """Up to ``limit`` open conversations of ``owner`` on ``channel``, newest first."""
    first_message = (
        select(func.substr(Turn.user_text, 1, FIRST_MESSAGE_CHARS))
        .where(Turn.conversation_id == Conversation.id)
        .order_by(Turn.seq)
        .limit(1)
        .correlate(Conversation)
        .scalar_subquery()
    )
    query = (
        select(
            Conversation.id,
            Conversation.external_key,
            Conversation.persona,
            Conversation.created_at,
            Conversation.updated_at,
            first_message,
        )
        .where(
            Conversation.owner == owner,
            Conversation.channel == channel,
            Conversation.closed_at.is_(None),
        )
        .order_by(Conversation.updated_at.desc(), Conversation.id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(
            or_(
                Conversation.updated_at < after.updated_at,
                and_(Conversation.updated_at == after.updated_at, Conversation.id > after.id),
            )
        )
    rows = (await session.execute(query)).all()
    return [
        ListedConversation(
            id=row[0],
            external_key=row[1],
            persona=row[2],
            created_at=as_utc(row[3]),
            updated_at=as_utc(row[4]),
            first_message=row[5],
        )
        for row in rows
    ]
