"""Rows of the turns that came with a history of their own (``openai_exchanges``), and the
statements that continue or seed such a conversation.

Each such turn's row names the state it answers: ``context_hash``, the exchanges
before it, and ``head_key``, those exchanges with its own message and its end user
(``bot.turns.carried``). ``head_key`` is set only while the turn is its
conversation's latest: the accept that continues the conversation clears it, in
the same transaction, so the index on (owner, head_key) holds the open heads and
nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import (
    Integer,
    String,
    bindparam,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from bot.storage.conversations import ConversationHead
from bot.storage.models import (
    Conversation,
    Message,
    OpenAIExchange,
    Turn,
    TurnStatus,
    new_id,
    table_of,
    utcnow,
)
from bot.storage.new_turns import TurnSlot

HEADS_CHECKED = 16
"""Open heads with one key looked at per request. They share the whole history and the
new message, so the first whose reply matches is as good as any: more than one is
only ever several end users of one key who said the very same things (and without
OpenAI's ``user`` field to tell them apart)."""


@dataclass(frozen=True)
class ExchangeRecord:
    """What a turn's row says besides its state: which API took it, and how it is shown."""

    api: str
    """``chat.completions`` or ``responses``."""
    stored: bool = True
    """The Responses API's ``store``: False keeps it from ``GET`` and ``previous_response_id``."""
    previous_response_id: str | None = None


@dataclass(frozen=True)
class OpenHead:
    """A conversation whose latest turn answered a given state, and that turn's reply."""

    turn_id: str
    conversation_id: str
    next_turn_seq: int
    reply_text: str


_CONVERSATIONS = table_of(Conversation)
_TURNS = table_of(Turn)
_EXCHANGES = table_of(OpenAIExchange)
_MESSAGES = table_of(Message)

_OPEN_HEADS = (
    select(
        _EXCHANGES.c.turn_id,
        _EXCHANGES.c.conversation_id,
        _CONVERSATIONS.c.next_turn_seq,
        _TURNS.c.reply_text,
    )
    .join(_TURNS, _TURNS.c.id == _EXCHANGES.c.turn_id)
    .join(_CONVERSATIONS, _CONVERSATIONS.c.id == _EXCHANGES.c.conversation_id)
    .where(
        _EXCHANGES.c.owner == bindparam("owner", type_=String),
        _EXCHANGES.c.head_key == bindparam("head_key", type_=String),
        _TURNS.c.status == TurnStatus.DONE,
        _CONVERSATIONS.c.closed_at.is_(None),
        # Still the latest turn (a regeneration or an edit over the HTTP API moves on).
        _CONVERSATIONS.c.next_turn_seq == _TURNS.c.seq + 1,
    )
    .order_by(_EXCHANGES.c.created_at.desc())
    .limit(HEADS_CHECKED)
)


async def open_heads(session: AsyncSession, owner: str, head_key: str) -> list[OpenHead]:
    """The owner's open conversations whose latest, answered turn has ``head_key``."""
    rows = await session.execute(_OPEN_HEADS, {"owner": owner, "head_key": head_key})
    return [OpenHead(row[0], row[1], int(row[2]), row[3] or "") for row in rows]


_TAKE_IF_LATEST = (
    update(_CONVERSATIONS)
    .where(
        _CONVERSATIONS.c.id == bindparam("conversation_id", type_=String),
        _CONVERSATIONS.c.closed_at.is_(None),
        _CONVERSATIONS.c.next_turn_seq == bindparam("expected_next", type_=Integer),
    )
    .values(next_turn_seq=_CONVERSATIONS.c.next_turn_seq + 1, updated_at=bindparam("touched_at"))
    .returning(
        _CONVERSATIONS.c.owner,
        _CONVERSATIONS.c.persona,
        _CONVERSATIONS.c.head_seq,
        # Written out: SQLite renders RETURNING with unqualified names (new_turns._TAKE_SLOT).
        literal_column(
            f"(SELECT max(entries.seq) FROM {Message.__tablename__} AS entries"
            f" WHERE entries.conversation_id = {Conversation.__tablename__}.id)",
            Integer,
        ),
    )
)
"""The next turn number of a conversation whose latest turn is still the one expected:
the check and the take in one statement, row-locked (PostgreSQL re-checks the condition
on the row a concurrent accept has just moved on)."""


async def take_slot_if_latest(
    connection: AsyncConnection, conversation_id: str, expected_next: int
) -> TurnSlot | None:
    """The conversation's next turn number, if nothing has been added since the turn
    whose number is ``expected_next - 1``; None (nothing changed) if something has."""
    row = (
        await connection.execute(
            _TAKE_IF_LATEST,
            {
                "conversation_id": conversation_id,
                "expected_next": expected_next,
                "touched_at": utcnow(),
            },
        )
    ).first()
    if row is None:
        return None
    owner, persona, head_seq, last_entry_seq = row
    next_seq = 0 if last_entry_seq is None else int(last_entry_seq) + 1
    head = ConversationHead(head_seq, next_seq, persona, owner)
    return TurnSlot(conversation_id, persona, expected_next, head)


@dataclass(frozen=True)
class SeedEntry:
    """One history entry of a conversation written from a carried history."""

    role: str
    text: str
    token_ids: bytes


async def open_seeded(
    connection: AsyncConnection,
    *,
    owner: str,
    channel: str,
    external_key: str,
    entries: Sequence[SeedEntry],
) -> TurnSlot:
    """A new conversation holding ``entries`` (a chain, oldest first) with its first turn's
    number taken: the slot of a turn that continues them."""
    conversation_id = new_id()
    now = utcnow()
    head_seq = len(entries) - 1 if entries else None
    await connection.execute(
        insert(_CONVERSATIONS),
        {
            "id": conversation_id,
            "owner": owner,
            "channel": channel,
            "external_key": external_key,
            "created_at": now,
            "updated_at": now,
            "next_turn_seq": 1,
            "head_seq": head_seq,
            "persona": None,
        },
    )
    if entries:
        await connection.execute(
            insert(_MESSAGES),
            [
                {
                    "conversation_id": conversation_id,
                    "seq": seq,
                    "parent_seq": seq - 1 if seq else None,
                    "role": entry.role,
                    "text": entry.text,
                    "token_ids": entry.token_ids,
                    "turn_id": None,
                    "created_at": now,
                }
                for seq, entry in enumerate(entries)
            ],
        )
    head = ConversationHead(head_seq, len(entries), None, owner)
    return TurnSlot(conversation_id, None, 0, head)


_CLEAR_HEAD = (
    update(_EXCHANGES)
    .where(_EXCHANGES.c.turn_id == bindparam("continued_turn_id", type_=String))
    .values(head_key=None)
)


async def record(
    connection: AsyncConnection,
    *,
    turn_id: str,
    conversation_id: str,
    owner: str,
    context_hash: str,
    head_key: str,
    exchange: ExchangeRecord,
    continued_turn_id: str | None,
) -> None:
    """The new turn's row; the turn it continues is no longer an open head."""
    if continued_turn_id is not None:
        await connection.execute(_CLEAR_HEAD, {"continued_turn_id": continued_turn_id})
    await connection.execute(
        insert(_EXCHANGES),
        {
            "turn_id": turn_id,
            "conversation_id": conversation_id,
            "owner": owner,
            "context_hash": context_hash,
            "head_key": head_key,
            "api": exchange.api,
            "stored": exchange.stored,
            "previous_response_id": exchange.previous_response_id,
            "created_at": utcnow(),
        },
    )


@dataclass(frozen=True)
class StoredResponse:
    """A turn reachable as a Responses API object (``store`` was not false)."""

    turn: Turn
    exchange: OpenAIExchange
    conversation: Conversation


async def find_response(session: AsyncSession, owner: str, turn_id: str) -> StoredResponse | None:
    row = (
        await session.execute(
            select(Turn, OpenAIExchange, Conversation)
            .join(OpenAIExchange, OpenAIExchange.turn_id == Turn.id)
            .join(Conversation, Conversation.id == Turn.conversation_id)
            .where(
                Turn.id == turn_id,
                OpenAIExchange.owner == owner,
                OpenAIExchange.stored.is_(True),
                Conversation.owner == owner,
            )
        )
    ).first()
    if row is None:
        return None
    turn, exchange, conversation = row
    return StoredResponse(turn, exchange, conversation)
