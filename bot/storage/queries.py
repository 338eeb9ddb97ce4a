"""Query functions. Each takes the session it runs in; none commits on its own."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from bot.storage.models import Conversation, InboundEvent, Message, Turn, TurnStatus, utcnow
from bot.storage.tokens import unpack_token_ids


async def open_conversation(
    session: AsyncSession,
    *,
    owner: str,
    channel: str,
    external_key: str,
    persona: str | None = None,
) -> Conversation:
    """The open conversation for this key, created (with ``persona``) if there is none.

    An existing conversation keeps the persona it was created with, whatever
    ``persona`` says: the caller compares them. Two requests racing to create the
    same conversation are settled by the partial unique index: the loser re-reads
    the winner's row.
    """
    query = select(Conversation).where(
        Conversation.owner == owner,
        Conversation.channel == channel,
        Conversation.external_key == external_key,
        Conversation.closed_at.is_(None),
    )
    conversation = (await session.scalars(query)).one_or_none()
    if conversation is not None:
        return conversation
    conversation = Conversation(
        owner=owner, channel=channel, external_key=external_key, persona=persona
    )
    try:
        async with session.begin_nested():
            session.add(conversation)
    except IntegrityError:
        return (await session.scalars(query)).one()
    return conversation


async def close_conversation(
    session: AsyncSession, *, owner: str, channel: str, external_key: str
) -> int:
    """Close the open conversation for this key (``/new``); the next message opens a fresh one."""
    result = await session.execute(
        update(Conversation)
        .where(
            Conversation.owner == owner,
            Conversation.channel == channel,
            Conversation.external_key == external_key,
            Conversation.closed_at.is_(None),
        )
        .values(closed_at=utcnow())
    )
    return int(getattr(result, "rowcount", 0) or 0)


async def conversation_persona(session: AsyncSession, conversation_id: str) -> str | None:
    persona: str | None = await session.scalar(
        select(Conversation.persona).where(Conversation.id == conversation_id)
    )
    return persona


async def find_event(session: AsyncSession, channel: str, event_id: str) -> InboundEvent | None:
    return (
        await session.scalars(
            select(InboundEvent).where(
                InboundEvent.channel == channel, InboundEvent.event_id == event_id
            )
        )
    ).one_or_none()


async def allocate_turn_seq(session: AsyncSession, conversation_id: str) -> int:
    """Take the conversation's next turn number (row-locked on PostgreSQL)."""
    result = await session.execute(
        update(Conversation)
        .where(Conversation.id == conversation_id)
        .values(next_turn_seq=Conversation.next_turn_seq + 1, updated_at=utcnow())
        .returning(Conversation.next_turn_seq)
    )
    return int(result.scalar_one()) - 1


async def get_turn(session: AsyncSession, turn_id: str) -> Turn | None:
    return await session.get(Turn, turn_id)


async def get_turn_for_owner(session: AsyncSession, turn_id: str, owner: str) -> Turn | None:
    """A turn, only if its conversation belongs to ``owner`` (else None: 404, not 403)."""
    return (
        await session.scalars(
            select(Turn)
            .join(Conversation, Conversation.id == Turn.conversation_id)
            .where(Turn.id == turn_id, Conversation.owner == owner)
        )
    ).one_or_none()


async def next_queued_turn(session: AsyncSession, conversation_id: str) -> Turn | None:
    return (
        await session.scalars(
            select(Turn)
            .where(Turn.conversation_id == conversation_id, Turn.status == TurnStatus.QUEUED)
            .order_by(Turn.seq)
            .limit(1)
        )
    ).one_or_none()


async def turns_with_status(session: AsyncSession, status: str) -> Sequence[Turn]:
    return (
        await session.scalars(select(Turn).where(Turn.status == status).order_by(Turn.created_at))
    ).all()


@dataclass(frozen=True)
class History:
    """The token-exact history of a conversation, ready to be extended."""

    prompt_ids: list[int]
    """Concatenation of every stored entry's ids: the next prompt starts with exactly these."""
    last_assistant_ids: list[int]
    next_seq: int
    ends_with_base: bool = False
    """The last entry is a compaction's base, which already closes its last reply."""


BASE_ROLE = "base"
"""Role of the entry a compaction writes (``bot.turns.compaction``): the history restarts there."""


async def load_history(session: AsyncSession, conversation_id: str) -> History:
    base_seq = await session.scalar(
        select(func.max(Message.seq)).where(
            Message.conversation_id == conversation_id, Message.role == BASE_ROLE
        )
    )
    query = (
        select(Message.seq, Message.role, Message.token_ids)
        .where(Message.conversation_id == conversation_id)
        .order_by(Message.seq)
    )
    if base_seq is not None:
        # Entries before the latest base were compacted away: they stay stored, unprompted.
        query = query.where(Message.seq >= base_seq)
    rows = (await session.execute(query)).all()
    prompt: list[int] = []
    last_assistant: list[int] = []
    last_role: str | None = None
    for _, role, packed in rows:
        ids = unpack_token_ids(packed)
        prompt.extend(ids)
        if role == "assistant":
            last_assistant = ids
        last_role = role
    next_seq = rows[-1][0] + 1 if rows else 0
    return History(prompt, last_assistant, next_seq, ends_with_base=last_role == BASE_ROLE)


async def count_messages(session: AsyncSession, conversation_id: str) -> int:
    return int(
        await session.scalar(
            select(func.count())
            .select_from(Message)
            .where(Message.conversation_id == conversation_id)
        )
        or 0
    )


def as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; they were written as UTC."""
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
