"""Conversation administration: list, show, export and delete (``botctl conversations ...``).

Delete is the right to be forgotten: it erases the conversation with its
messages, turns and inbound events, and says how many rows of each it removed.

Both work on a live service's database in short transactions, a batch of
conversations each: an export never holds a transaction while its consumer
is slow (``botctl conversations export | slow-consumer``), and a large delete
never holds the write lock (SQLite) or the rows' locks (PostgreSQL) for longer
than one batch, so the running service's turns do not wait for either.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.models import Conversation, InboundEvent, Message, Turn, as_utc
from bot.turns.status import shown_status

EXPORT_BATCH = 20
"""Conversations read per transaction by an export (each read whole, in one snapshot)."""
DELETE_BATCH = 20
"""Conversations erased per transaction by a delete."""


@dataclass(frozen=True)
class Selector:
    """Which conversations a command acts on; empty fields do not filter."""

    ids: tuple[str, ...] = ()
    owner: str | None = None
    channel: str | None = None
    external_key: str | None = None

    @property
    def is_empty(self) -> bool:
        return not (self.ids or self.owner or self.channel or self.external_key)

    def apply(self, query: Select[Any]) -> Select[Any]:
        if self.ids:
            query = query.where(Conversation.id.in_(self.ids))
        if self.owner is not None:
            query = query.where(Conversation.owner == self.owner)
        if self.channel is not None:
            query = query.where(Conversation.channel == self.channel)
        if self.external_key is not None:
            query = query.where(Conversation.external_key == self.external_key)
        return query


def _iso(value: dt.datetime | None) -> str | None:
    return as_utc(value).isoformat() if value is not None else None


def conversation_dict(conversation: Conversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "owner": conversation.owner,
        "channel": conversation.channel,
        "external_key": conversation.external_key,
        "created_at": _iso(conversation.created_at),
        "updated_at": _iso(conversation.updated_at),
        "closed_at": _iso(conversation.closed_at),
    }


def turn_dict(turn: Turn) -> dict[str, Any]:
    return {
        "id": turn.id,
        "seq": turn.seq,
        "status": shown_status(turn.status, turn.error_class),
        "user_id": turn.user_id,
        "user_text": turn.user_text,
        "reply_text": turn.reply_text,
        "error_class": turn.error_class,
        "prompt_tokens": turn.prompt_tokens,
        "cached_tokens": turn.cached_tokens,
        "completion_tokens": turn.completion_tokens,
        "attempt": turn.attempt,
        "regenerates_turn_id": turn.regenerates_turn_id,
        "edits_turn_id": turn.edits_turn_id,
        "created_at": _iso(turn.created_at),
        "finished_at": _iso(turn.finished_at),
    }


async def list_conversations(
    session: AsyncSession, selector: Selector, *, limit: int | None = None
) -> list[dict[str, Any]]:
    """Newest first, each with its number of turns."""
    turn_count = (
        select(func.count())
        .select_from(Turn)
        .where(Turn.conversation_id == Conversation.id)
        .scalar_subquery()
    )
    query = selector.apply(select(Conversation, turn_count)).order_by(
        Conversation.updated_at.desc(), Conversation.id
    )
    if limit is not None:
        query = query.limit(limit)
    rows = (await session.execute(query)).all()
    return [{**conversation_dict(conv), "turns": int(count)} for conv, count in rows]


async def find_conversations(
    session: AsyncSession, ref: str, *, owner: str | None = None, channel: str | None = None
) -> list[Conversation]:
    """The conversations ``ref`` names, newest first: the one with that internal id, else
    those with that channel key (the id the user knows: the HTTP API's ``conversation_id``,
    Telegram's ``chat:42``, ...), narrowed to ``owner`` and ``channel`` when given.

    One key has several conversations when the user started over (``/new``), and one
    per owner or channel that uses it.
    """
    selector = Selector((), owner, channel)
    by_id = (
        await session.scalars(selector.apply(select(Conversation)).where(Conversation.id == ref))
    ).all()
    if by_id:
        return list(by_id)
    query = selector.apply(select(Conversation)).where(Conversation.external_key == ref)
    ordered = query.order_by(Conversation.updated_at.desc(), Conversation.id)
    return list((await session.scalars(ordered)).all())


async def load_conversation(session: AsyncSession, conversation_id: str) -> dict[str, Any] | None:
    """A conversation with its turns and messages (text only: token ids stay in the database)."""
    conversation = await session.get(Conversation, conversation_id)
    if conversation is None:
        return None
    turns = (
        await session.scalars(
            select(Turn).where(Turn.conversation_id == conversation_id).order_by(Turn.seq)
        )
    ).all()
    messages = (
        await session.execute(
            select(
                Message.seq,
                Message.parent_seq,
                Message.role,
                Message.text,
                Message.turn_id,
                Message.created_at,
            )
            .where(Message.conversation_id == conversation_id)
            .order_by(Message.seq)
        )
    ).all()
    return {
        **conversation_dict(conversation),
        # The history is a tree (``Message``): each entry names its parent, this the active end.
        "head_seq": conversation.head_seq,
        "turns": [turn_dict(turn) for turn in turns],
        "messages": [
            {
                "seq": seq,
                "parent_seq": parent_seq,
                "role": role,
                "text": text,
                "turn_id": turn_id,
                "created_at": _iso(created_at),
            }
            for seq, parent_seq, role, text, turn_id, created_at in messages
        ],
    }


async def selected_ids(session: AsyncSession, selector: Selector) -> list[str]:
    query = selector.apply(select(Conversation.id)).order_by(
        Conversation.created_at, Conversation.id
    )
    return list((await session.scalars(query)).all())


async def export_conversations(
    read_sessions: async_sessionmaker[AsyncSession],
    ids: Sequence[str],
    batch: int = EXPORT_BATCH,
) -> AsyncIterator[dict[str, Any]]:
    """One document per conversation, read ``batch`` at a time in a short read-only transaction.

    The transaction ends before the documents are handed out, so a consumer that
    blocks (a full pipe) holds no snapshot and no lock. A conversation deleted
    meanwhile is left out.
    """
    for start in range(0, len(ids), batch):
        async with read_sessions() as session:
            documents = [
                await load_conversation(session, conversation_id)
                for conversation_id in ids[start : start + batch]
            ]
        for document in documents:
            if document is not None:
                yield document


@dataclass(frozen=True)
class Removed:
    conversations: int = 0
    turns: int = 0
    messages: int = 0
    inbound_events: int = 0

    def __add__(self, other: Removed) -> Removed:
        return Removed(
            self.conversations + other.conversations,
            self.turns + other.turns,
            self.messages + other.messages,
            self.inbound_events + other.inbound_events,
        )


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


async def delete_conversation(session: AsyncSession, conversation_id: str) -> Removed:
    """Erase one conversation and everything recorded under it.

    Deleted explicitly, child tables first, rather than by the foreign keys'
    cascade: the counts are the report, and the dedupe rows of the inbound
    events go too (they hold the platform's event ids).
    """
    messages = await session.execute(
        delete(Message).where(Message.conversation_id == conversation_id)
    )
    events = await session.execute(
        delete(InboundEvent).where(InboundEvent.conversation_id == conversation_id)
    )
    turns = await session.execute(delete(Turn).where(Turn.conversation_id == conversation_id))
    conversations = await session.execute(
        delete(Conversation).where(Conversation.id == conversation_id)
    )
    return Removed(
        conversations=_rowcount(conversations),
        turns=_rowcount(turns),
        messages=_rowcount(messages),
        inbound_events=_rowcount(events),
    )


async def delete_conversations(
    sessions: async_sessionmaker[AsyncSession],
    ids: Sequence[str],
    batch: int = DELETE_BATCH,
) -> Removed:
    """Erase ``ids``, ``batch`` conversations per transaction; what was removed, in total."""
    removed = Removed()
    for start in range(0, len(ids), batch):
        async with sessions() as session, session.begin():
            for conversation_id in ids[start : start + batch]:
                removed += await delete_conversation(session, conversation_id)
    return removed
