"""A new message's turn stored: the conversation's next turn number (its slot), the turn's
row and its inbound event, on PostgreSQL in one statement (``place_turn``).

Each function takes the session or connection it runs in; none commits on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from bot.storage import in_place
from bot.storage.conversations import (
    CONVERSATIONS,
    ConversationHead,
    create_conversation,
    next_entry_seq,
    open_for_key,
)
from bot.storage.models import Conversation, InboundEvent, Message, Turn, new_id, table_of, utcnow


@dataclass(frozen=True)
class TurnSlot:
    """Where a new turn goes: its open conversation and the turn number it took there."""

    conversation_id: str
    persona: str | None
    """The conversation's persona (a new one is created with the one asked for)."""
    seq: int
    head: ConversationHead | None = None
    """The conversation's head as the slot was taken (``take_turn_slot``), in its transaction."""


_TAKE_SLOT = (
    # The table, not the mapped class: an ORM-enabled UPDATE ... RETURNING goes through
    # the ORM's bulk machinery (and its result through the ORM's loading), which cost the
    # accept more than the statement itself; nothing here is loaded as an object.
    update(CONVERSATIONS)
    .where(
        *open_for_key(
            # Not the columns' own names: those are reserved for an UPDATE's SET.
            bindparam("key_owner", type_=String),
            bindparam("key_channel", type_=String),
            bindparam("key_external", type_=String),
        )
    )
    .values(next_turn_seq=CONVERSATIONS.c.next_turn_seq + 1, updated_at=bindparam("touched_at"))
    .returning(CONVERSATIONS.c.id, CONVERSATIONS.c.persona, CONVERSATIONS.c.next_turn_seq)
)
"""The next turn number of a key's open conversation; built once (every accept runs it)."""
_TAKE_SLOT_AND_HEAD = _TAKE_SLOT.returning(
    CONVERSATIONS.c.head_seq,
    # Written out: SQLite's RETURNING is rendered with unqualified names, a subquery's
    # too, where ``id`` would be the entry's own instead of the updated conversation's.
    literal_column(
        f"(SELECT max(entries.seq) FROM {Message.__tablename__} AS entries"
        f" WHERE entries.conversation_id = {Conversation.__tablename__}.id)",
        Integer,
    ),
)
"""The same, and the conversation's head (``ConversationHead``) as the slot is taken: a
turn stored running in that transaction takes its history's head from here, not from a
read of its own."""


async def take_turn_slot(
    connection: AsyncConnection,
    *,
    owner: str,
    channel: str,
    external_key: str,
    persona: str | None = None,
) -> TurnSlot:
    """The next turn number of the open conversation for this key, created if there is none.

    ``open_conversation`` and ``allocate_turn_seq`` in one statement when the
    conversation exists (every message but a conversation's first): an accept
    holds the write lock while it runs, so each round trip saved there is one
    every other writer waits less. Row-locked on PostgreSQL like
    ``allocate_turn_seq``; a race to create the conversation is settled like in
    ``open_conversation``.
    """
    take = {
        "key_owner": owner,
        "key_channel": channel,
        "key_external": external_key,
        "touched_at": utcnow(),
    }
    rows = await in_place.execute(connection, _TAKE_SLOT_AND_HEAD, take)
    if rows:
        return _slot_of(rows[0], owner)
    # The first turn takes seq 0 as the conversation is created; a race to create it lost,
    # the next number in the winner's.
    conversation_id = await create_conversation(
        connection,
        owner=owner,
        channel=channel,
        external_key=external_key,
        persona=persona,
        next_turn_seq=1,
    )
    if conversation_id is None:
        row = (await connection.execute(_TAKE_SLOT_AND_HEAD, take)).one()
        return _slot_of(row, owner)
    return TurnSlot(conversation_id, persona, 0, ConversationHead(None, 0, persona, owner))


def _slot_of(row: Any, owner: str) -> TurnSlot:
    """A ``_TAKE_SLOT_AND_HEAD`` row."""
    conversation_id, persona, next_turn_seq, head_seq, last_entry_seq = row
    head = ConversationHead(head_seq, next_entry_seq(last_entry_seq), persona, owner)
    return TurnSlot(conversation_id, persona, int(next_turn_seq) - 1, head)


_TURNS = table_of(Turn)
_EVENTS = table_of(InboundEvent)
_INSERT_TURN = insert(_TURNS)
_INSERT_EVENT = insert(_EVENTS)


def _insert_turn_and_event(columns: frozenset[str]) -> Any:
    """PostgreSQL: a new turn (these columns given) and its inbound event, one statement.

    The turn's INSERT is a data-modifying CTE the event's INSERT selects from: one
    round trip instead of two. (SQLite has no such CTE, nor round trips to save.)
    """
    new_turn = (
        insert(_TURNS)
        .values({column: bindparam(column, type_=_TURNS.c[column].type) for column in columns})
        .returning(_TURNS.c.id, _TURNS.c.conversation_id)
        .cte("new_turn")
    )
    return _event_of(new_turn)


def _event_of(new_turn: Any) -> Any:
    """PostgreSQL: the inbound event's INSERT of the turn ``new_turn`` (a CTE) inserts.

    Parameters ``event_channel``, ``event_id``, ``received_at``: not the event's column
    names, which a statement around it may take for its own.
    """
    return insert(_EVENTS).from_select(
        ["channel", "event_id", "conversation_id", "turn_id", "received_at"],
        select(
            bindparam("event_channel", type_=String),
            bindparam("event_id", type_=String),
            new_turn.c.conversation_id,
            new_turn.c.id,
            bindparam("received_at", type_=_EVENTS.c.received_at.type),
        ),
    )


_TURN_AND_EVENT: dict[frozenset[str], Any] = {}
"""Built once per set of columns an accept gives (a turn stored queued, or running)."""


async def insert_turn(
    connection: AsyncConnection, turn: dict[str, Any], *, channel: str, event_id: str
) -> None:
    """A new turn's row (``turn``: its columns, ``id`` and status included) and its inbound
    event.

    Plain INSERTs, not ORM objects: an accept needs nothing back, and the unit of work
    that would flush two objects cost the event loop more than both statements.
    A redelivery fails here or at commit with ``IntegrityError`` (channel, event_id).
    """
    if connection.dialect.name == "postgresql":
        columns = frozenset(turn)
        statement = _TURN_AND_EVENT.get(columns)
        if statement is None:
            statement = _TURN_AND_EVENT[columns] = _insert_turn_and_event(columns)
        await connection.execute(
            statement,
            {**turn, "event_channel": channel, "event_id": event_id, "received_at": utcnow()},
        )
        return
    await in_place.execute(connection, _INSERT_TURN, turn)
    await in_place.execute(
        connection,
        _INSERT_EVENT,
        {
            "channel": channel,
            "event_id": event_id,
            "conversation_id": turn["conversation_id"],
            "turn_id": turn["id"],
        },
    )


@dataclass(frozen=True)
class PlacedTurn:
    """What ``place_turn`` did: the slot taken, and whether the turn went in."""

    slot: TurnSlot
    stored: bool
    """False: the conversation's persona is not the one asked for (or the ``admission``
    refused), and nothing was added (the caller refuses the message, which rolls the
    slot back; all or nothing, the statement failed instead)."""


@dataclass(frozen=True)
class Admission:
    """A condition a turn must meet to be stored, checked in ``place_turn``'s statement.

    ``condition(slot)``: a SQL condition, built (once per statement shape) around the
    ``slot`` CTE (the conversation's next turn number, taken); it may add CTEs of its own
    that write only where the slot has a row (fair use's take, ``bot.turns.limits``).
    ``parameters``: its bound values for this message.
    """

    condition: Callable[[Any], Any]
    parameters: Mapping[str, Any]


def _slot_or_new_conversation() -> Any:
    """PostgreSQL: ``_TAKE_SLOT`` as a CTE (``id``, ``persona``, ``next_turn_seq``) that,
    where the key has no open conversation, creates it with the first turn's number
    taken (``next_turn_seq`` 1) and the persona asked for.

    The creation's INSERT runs only where the slot's UPDATE found no row, and does nothing
    where another request's creation of the same key got there first (the partial unique
    index; PostgreSQL waits for that request to end): the CTE then has no row, as when
    nothing was found before this CTE existed, and the caller's transaction settles it.
    Parameters: ``_TAKE_SLOT``'s, ``new_conversation_id`` and ``asked_persona``.
    """
    found = _TAKE_SLOT.cte("slot")
    touched = bindparam("touched_at", type_=CONVERSATIONS.c.updated_at.type)
    created = (
        postgresql.insert(CONVERSATIONS)
        .from_select(
            [
                "id",
                "owner",
                "channel",
                "external_key",
                "persona",
                "next_turn_seq",
                "created_at",
                "updated_at",
            ],
            select(
                bindparam("new_conversation_id", type_=String),
                bindparam("key_owner", type_=String),
                bindparam("key_channel", type_=String),
                bindparam("key_external", type_=String),
                bindparam("asked_persona", type_=String),
                literal(1, Integer),
                touched,
                touched,
            ).where(~select(found.c.id).exists()),
            include_defaults=False,
        )
        .on_conflict_do_nothing()
        .returning(CONVERSATIONS.c.id, CONVERSATIONS.c.persona, CONVERSATIONS.c.next_turn_seq)
        .cte("new_conversation")
    )
    return union_all(
        select(found.c.id, found.c.persona, found.c.next_turn_seq),
        select(created.c.id, created.c.persona, created.c.next_turn_seq),
    ).cte("slot_or_new")


def _slot_turn_and_event(
    columns: frozenset[str],
    *,
    announce: bool,
    admission: Callable[[Any], Any] | None = None,
    all_or_nothing: bool = False,
) -> Any:
    """PostgreSQL: the slot (``_slot_or_new_conversation``: the key's conversation
    created for its first message), the turn's INSERT and its event's, one statement.

    The turn's INSERT selects its conversation and number from the slot (data-modifying
    CTEs), only where the conversation's persona is the one asked
    for (and ``admission``'s condition holds); the event's INSERT selects from the
    turn's. With ``announce`` the event's RETURNING also calls
    ``pg_notify(:announce_channel, conversation_id)``: once, for a stored turn,
    delivered at commit. ``all_or_nothing``: a slot taken for a turn that is then not
    stored fails the statement (a division by the turns stored, zero), which undoes the
    slot and everything else it wrote: outside a transaction the statement stores the
    turn or changes nothing.
    """
    slot = _slot_or_new_conversation()
    asked = bindparam("asked_persona", type_=String)
    condition = or_(asked.is_(None), slot.c.persona == asked)
    if admission is not None:
        condition = and_(condition, admission(slot))
    given = sorted(columns)
    new_turn = (
        insert(_TURNS)
        .from_select(
            [*given, "conversation_id", "seq"],
            select(
                # Named apart from the conversation's columns: an UPDATE (the slot's)
                # would take a parameter named like one of its columns into its SET.
                *(bindparam(f"turn_{column}", type_=_TURNS.c[column].type) for column in given),
                slot.c.id,
                slot.c.next_turn_seq - 1,
            ).where(condition),
            # The columns not given take the table's server defaults (``attempt``): the
            # Python-side ones SQLAlchemy would add get no value inside a CTE.
            include_defaults=False,
        )
        .returning(_TURNS.c.id, _TURNS.c.conversation_id)
        .cte("new_turn")
    )
    returned: list[Any] = [_EVENTS.c.turn_id]
    if announce:
        returned.append(
            func.pg_notify(bindparam("announce_channel", type_=String), _EVENTS.c.conversation_id)
        )
    event = _event_of(new_turn).returning(*returned).cte("event")
    stored = select(func.count()).select_from(event).scalar_subquery()
    returned = [slot.c.id, slot.c.persona, slot.c.next_turn_seq, stored]
    if all_or_nothing:
        returned.append((literal(1) / stored).label("stored_or_fail"))
    return select(*returned)


_SLOT_TURN_AND_EVENT: dict[tuple[Any, ...], Any] = {}
"""Built once per set of columns an accept gives, with or without an announcement, an
admission, all or nothing."""


async def place_turn(
    session: AsyncSession,
    *,
    owner: str,
    channel: str,
    external_key: str,
    persona: str | None,
    turn: dict[str, Any],
    event_channel: str,
    event_id: str,
    announce_channel: str | None = None,
    admission: Admission | None = None,
    all_or_nothing: bool = False,
) -> PlacedTurn | None:
    """A message's turn in its open conversation, created for the key's first message:
    ``take_turn_slot`` and ``insert_turn`` in one statement, on PostgreSQL (one round
    trip where they take two, or four for a first message, and the slot's row lock is
    taken one round trip later). ``turn``: the row's columns but its conversation and
    number, which come from the slot.

    None where it does not apply, with nothing done: on SQLite (no round trips to
    save, and a turn there may be stored running once its conversation is known),
    and when another request was creating the key's conversation at the same time
    and got there first (the caller's ``take_turn_slot`` finds it). A redelivery fails with
    ``IntegrityError`` (channel, event_id), as in ``insert_turn``. ``announce_channel``:
    ``pg_notify`` there with the conversation's id once the turn is stored.
    ``admission``: a further condition of the turn's (fair use's). ``all_or_nothing``
    (``_slot_turn_and_event``): a slot taken for a turn not stored raises ``DBAPIError``
    (SQLSTATE 22012, division by zero) and the statement changes nothing, for a caller
    outside a transaction.
    """
    connection = await session.connection()
    if connection.dialect.name != "postgresql":
        return None
    condition = None if admission is None else admission.condition
    shape = (frozenset(turn), announce_channel is not None, condition, all_or_nothing)
    statement = _SLOT_TURN_AND_EVENT.get(shape)
    if statement is None:
        statement = _SLOT_TURN_AND_EVENT[shape] = _slot_turn_and_event(
            shape[0], announce=shape[1], admission=condition, all_or_nothing=all_or_nothing
        )
    parameters = {
        **{f"turn_{column}": value for column, value in turn.items()},
        "key_owner": owner,
        "key_channel": channel,
        "key_external": external_key,
        "touched_at": utcnow(),
        "asked_persona": persona,
        "new_conversation_id": new_id(),
        "event_channel": event_channel,
        "event_id": event_id,
        "received_at": utcnow(),
    }
    if announce_channel is not None:
        parameters["announce_channel"] = announce_channel
    if admission is not None:
        parameters.update(admission.parameters)
    row = (await connection.execute(statement, parameters)).one_or_none()
    if row is None:
        return None
    return PlacedTurn(TurnSlot(row[0], row[1], int(row[2]) - 1), stored=bool(row[3]))
