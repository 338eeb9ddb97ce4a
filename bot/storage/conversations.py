"""A key's open conversation: found, created, closed, its turn numbers and its head.

Each function takes the session it runs in; none commits on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, String, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from bot.storage.models import Conversation, Message, new_id, table_of, utcnow

CONVERSATIONS = table_of(Conversation)


def open_for_key(
    owner: str | ColumnElement[str],
    channel: str | ColumnElement[str],
    external_key: str | ColumnElement[str],
) -> tuple[ColumnElement[bool], ...]:
    """The conditions of a key's open conversation (at most one: a partial unique index).

    On the table's columns, which the ORM's statements take as well: with the mapped
    class's, a Core statement (``bot.storage.new_turns._TAKE_SLOT``) would become an
    ORM-enabled one.
    """
    return (
        CONVERSATIONS.c.owner == owner,
        CONVERSATIONS.c.channel == channel,
        CONVERSATIONS.c.external_key == external_key,
        CONVERSATIONS.c.closed_at.is_(None),
    )


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
    query = select(Conversation).where(*open_for_key(owner, channel, external_key))
    conversation = (await session.scalars(query)).one_or_none()
    if conversation is not None:
        return conversation
    await create_conversation(
        await session.connection(),
        owner=owner,
        channel=channel,
        external_key=external_key,
        persona=persona,
    )
    return (await session.scalars(query)).one()  # ours, or the one that won the race


_CREATE_CONVERSATION = {
    # A key's open conversation, unless another request has just created it (the partial
    # unique index): then no row comes back. Per dialect: ON CONFLICT is not core SQL.
    dialect.dialect.name: dialect.insert(CONVERSATIONS)
    .on_conflict_do_nothing()
    .returning(CONVERSATIONS.c.id)
    for dialect in (postgresql, sqlite)
}


async def create_conversation(
    connection: AsyncConnection,
    *,
    owner: str,
    channel: str,
    external_key: str,
    persona: str | None,
    next_turn_seq: int = 0,
) -> str | None:
    """Create the key's open conversation: its id, or None when another request created
    it first (a race settled by the partial unique index: the caller finds the winner's).

    One statement: no savepoint around it, no ORM flush, and no error to roll back to.
    """
    conversation_id = new_id()
    created = {
        "id": conversation_id,
        "owner": owner,
        "channel": channel,
        "external_key": external_key,
        "persona": persona,
        "next_turn_seq": next_turn_seq,
    }
    statement = _CREATE_CONVERSATION[connection.dialect.name]
    if (await connection.execute(statement, created)).first() is None:
        return None
    return conversation_id


@dataclass(frozen=True)
class ConversationHead:
    """Where a conversation's history read starts: what ``History`` takes from the
    conversation's row, read in one statement."""

    head_seq: int | None
    """The active branch's last entry; None: no history yet."""
    next_seq: int
    """The conversation's next free ``messages.seq``."""
    persona: str | None
    owner: str | None


NO_CONVERSATION = ConversationHead(None, 0, None, None)


def next_entry_seq(last_entry_seq: int | None) -> int:
    """The next entry's seq."""
    return 0 if last_entry_seq is None else int(last_entry_seq) + 1


async def find_open_conversation(
    session: AsyncSession, *, owner: str, channel: str, external_key: str
) -> Conversation | None:
    return (
        await session.scalars(
            select(Conversation).where(*open_for_key(owner, channel, external_key))
        )
    ).one_or_none()


async def close_conversation(
    session: AsyncSession, *, owner: str, channel: str, external_key: str
) -> int:
    """Close the open conversation for this key (``/new``); the next message opens a fresh one."""
    result = await session.execute(
        update(Conversation)
        .where(*open_for_key(owner, channel, external_key))
        .values(closed_at=utcnow())
    )
    return int(getattr(result, "rowcount", 0) or 0)


async def allocate_turn_seq(session: AsyncSession, conversation_id: str) -> int:
    """Take the conversation's next turn number (row-locked on PostgreSQL)."""
    result = await session.execute(
        update(Conversation)
        .where(Conversation.id == conversation_id)
        .values(next_turn_seq=Conversation.next_turn_seq + 1, updated_at=utcnow())
        .returning(Conversation.next_turn_seq)
        .execution_options(synchronize_session=False)
    )
    return int(result.scalar_one()) - 1


_HEAD = select(
    Conversation.head_seq,
    select(func.max(Message.seq))
    .where(Message.conversation_id == bindparam("conversation_id", type_=String))
    .scalar_subquery(),
    Conversation.persona,
    Conversation.owner,
).where(Conversation.id == bindparam("conversation_id", type_=String))
"""The head, the last seq, the persona and the owner: one round trip."""


async def read_head(session: AsyncSession, conversation_id: str) -> ConversationHead:
    """The conversation's head as it is now (``NO_CONVERSATION`` if there is none)."""
    row = (await session.execute(_HEAD, {"conversation_id": conversation_id})).one_or_none()
    if row is None:
        return NO_CONVERSATION
    head_seq, last_entry_seq, persona, owner = row
    return ConversationHead(head_seq, next_entry_seq(last_entry_seq), persona, owner)
