"""Query functions. Each takes the session it runs in; none commits on its own."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
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
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import aliased

from bot.storage import in_place
from bot.storage.known_paths import KnownPath, KnownPaths
from bot.storage.models import (
    BASE_ROLE,
    Conversation,
    InboundEvent,
    Message,
    Turn,
    new_id,
    table_of,
    utcnow,
)
from bot.storage.tokens import unpack_token_ids

_CONVERSATIONS = table_of(Conversation)


def _open_for_key(
    owner: str | ColumnElement[str],
    channel: str | ColumnElement[str],
    external_key: str | ColumnElement[str],
) -> tuple[ColumnElement[bool], ...]:
    """The conditions of a key's open conversation (at most one: a partial unique index).

    On the table's columns, which the ORM's statements take as well: with the mapped
    class's, a Core statement (``_TAKE_SLOT``) would become an ORM-enabled one.
    """
    return (
        _CONVERSATIONS.c.owner == owner,
        _CONVERSATIONS.c.channel == channel,
        _CONVERSATIONS.c.external_key == external_key,
        _CONVERSATIONS.c.closed_at.is_(None),
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
    query = select(Conversation).where(*_open_for_key(owner, channel, external_key))
    conversation = (await session.scalars(query)).one_or_none()
    if conversation is not None:
        return conversation
    await _create_conversation(
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
    dialect.dialect.name: dialect.insert(_CONVERSATIONS)
    .on_conflict_do_nothing()
    .returning(_CONVERSATIONS.c.id)
    for dialect in (postgresql, sqlite)
}


async def _create_conversation(
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
    update(_CONVERSATIONS)
    .where(
        *_open_for_key(
            # Not the columns' own names: those are reserved for an UPDATE's SET.
            bindparam("key_owner", type_=String),
            bindparam("key_channel", type_=String),
            bindparam("key_external", type_=String),
        )
    )
    .values(next_turn_seq=_CONVERSATIONS.c.next_turn_seq + 1, updated_at=bindparam("touched_at"))
    .returning(_CONVERSATIONS.c.id, _CONVERSATIONS.c.persona, _CONVERSATIONS.c.next_turn_seq)
)
"""The next turn number of a key's open conversation; built once (every accept runs it)."""
_TAKE_SLOT_AND_HEAD = _TAKE_SLOT.returning(
    _CONVERSATIONS.c.head_seq,
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
    conversation_id = await _create_conversation(
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
    head = ConversationHead(head_seq, _after(last_entry_seq), persona, owner)
    return TurnSlot(conversation_id, persona, int(next_turn_seq) - 1, head)


def _after(last_entry_seq: int | None) -> int:
    """The next entry's seq."""
    return 0 if last_entry_seq is None else int(last_entry_seq) + 1


# The tables, not the mapped classes: an ORM-enabled INSERT goes through the ORM's bulk
# machinery for nothing here.
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
    touched = bindparam("touched_at", type_=_CONVERSATIONS.c.updated_at.type)
    created = (
        postgresql.insert(_CONVERSATIONS)
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
        .returning(_CONVERSATIONS.c.id, _CONVERSATIONS.c.persona, _CONVERSATIONS.c.next_turn_seq)
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


async def find_open_conversation(
    session: AsyncSession, *, owner: str, channel: str, external_key: str
) -> Conversation | None:
    return (
        await session.scalars(
            select(Conversation).where(*_open_for_key(owner, channel, external_key))
        )
    ).one_or_none()


async def close_conversation(
    session: AsyncSession, *, owner: str, channel: str, external_key: str
) -> int:
    """Close the open conversation for this key (``/new``); the next message opens a fresh one."""
    result = await session.execute(
        update(Conversation)
        .where(*_open_for_key(owner, channel, external_key))
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


@dataclass(frozen=True)
class History:
    """The token-exact history up to one entry of the conversation's tree, ready to be extended."""

    prompt_ids: list[int]
    """Concatenation of the entries on the path: the next prompt starts with exactly these."""
    last_assistant_ids: list[int]
    next_seq: int
    """The conversation's next free ``messages.seq`` (insertion order, across every branch)."""
    ends_with_base: bool = False
    """The last entry is a compaction's base, which already closes its last reply."""
    head_seq: int | None = None
    """The path's last entry, which the next entry names as its parent; None: empty history."""
    last_role: str | None = None
    persona: str | None = None
    """The preset the conversation started with (``conversations.persona``); None: default."""
    owner: str | None = None
    """Whose conversation it is (``conversations.owner``): its tenant's cache salt."""


@dataclass(frozen=True)
class PathEntry:
    seq: int
    role: str
    text: str
    turn_id: str | None
    token_ids: bytes
    parent_seq: int | None = None


def _path_statement(*, through_bases: bool) -> Select[int, str, str, str | None, bytes, int | None]:
    # Built once, with bound parameters: building the recursive query anew for every
    # turn cost the event loop about a millisecond of SQLAlchemy's construction.
    conversation_id = bindparam("conversation_id", type_=String)
    step = select(Message.seq, Message.parent_seq, Message.role).where(
        Message.conversation_id == conversation_id,
        Message.seq == bindparam("head_seq", type_=Integer),
    )
    path = step.cte("path", recursive=True)
    parent = aliased(Message)

    def parents(column: Any) -> Any:
        return (
            select(column)
            .where(parent.conversation_id == conversation_id, parent.seq == path.c.parent_seq)
            .scalar_subquery()
        )

    # Each step looks its parent up by (conversation_id, seq), the unique index, in
    # correlated subqueries: written as a join, PostgreSQL's planner hashed the whole
    # conversation at every step (400 entries: 50 ms instead of 4).
    climb = select(path.c.parent_seq, parents(parent.parent_seq), parents(parent.role)).where(
        # Entries at or below ``above`` are not walked: their part of the path is known.
        path.c.parent_seq > bindparam("above", type_=Integer)
    )
    if not through_bases:
        climb = climb.where(path.c.role != BASE_ROLE)
    path = path.union_all(climb)
    return (
        select(
            Message.seq,
            Message.role,
            Message.text,
            Message.turn_id,
            Message.token_ids,
            Message.parent_seq,
        )
        .where(Message.conversation_id == conversation_id, Message.seq.in_(select(path.c.seq)))
        .order_by(Message.seq)
    )


_PATH = {through: _path_statement(through_bases=through) for through in (False, True)}

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
    return ConversationHead(head_seq, _after(last_entry_seq), persona, owner)


async def path_entries(
    session: AsyncSession,
    conversation_id: str,
    head_seq: int,
    *,
    through_bases: bool = False,
    above: int = -1,
) -> list[PathEntry]:
    """The entries from the root down to ``head_seq``, in order (one recursive query).

    Without ``through_bases`` the walk stops at the latest base on the path: what
    is above it was compacted away (stored, no longer prompted). With ``above``,
    it stops before the first entry whose seq is not greater (a known part).
    """
    rows = await session.execute(
        _PATH[through_bases],
        {"conversation_id": conversation_id, "head_seq": head_seq, "above": above},
    )
    return [PathEntry(*row) for row in rows]


async def load_history(
    session: AsyncSession,
    conversation_id: str,
    *,
    at: int | None = None,
    known: KnownPaths | None = None,
    head: ConversationHead | None = None,
) -> History:
    """The prompt up to entry ``at`` (default: the conversation's head; -1: empty).

    With ``known``, only the entries added since the conversation's last path read
    there are fetched, when the new path extends it (the same branch, no new base):
    with ``head`` too (the conversation's row, read where its turn was started) and
    the path known up to that head, nothing is read.
    """
    if head is None:
        head = await read_head(session, conversation_id)
    if at is None:
        at = head.head_seq
    if at is None or at < 0:
        return _history(None, head)
    return _history(await _read_path(session, conversation_id, at, known), head)


def known_history(
    conversation_id: str, head: ConversationHead, known: KnownPaths
) -> History | None:
    """``load_history`` at ``head`` when it would read nothing: no history yet, or the path
    to the head known here. None: it must be read (no session is opened before that)."""
    if head.head_seq is None or head.head_seq < 0:
        return _history(None, head)
    path = known.get(conversation_id)
    return _history(path, head) if path is not None and path.head_seq == head.head_seq else None


def _history(path: KnownPath | None, head: ConversationHead) -> History:
    if path is None:
        return History([], [], head.next_seq, persona=head.persona, owner=head.owner)
    return History(
        unpack_token_ids(path.prompt),
        unpack_token_ids(path.last_assistant),
        head.next_seq,
        ends_with_base=path.last_role == BASE_ROLE,
        head_seq=path.head_seq,
        last_role=path.last_role,
        persona=head.persona,
        owner=head.owner,
    )


async def _read_path(
    session: AsyncSession, conversation_id: str, at: int, known: KnownPaths | None
) -> KnownPath | None:
    earlier = known.get(conversation_id) if known is not None else None
    if earlier is not None and earlier.head_seq == at:
        return earlier
    # A parent's seq is always smaller than its children's: a path that extends the
    # known one has all its new entries above the known head.
    above = earlier.head_seq if earlier is not None and earlier.head_seq < at else -1
    entries = await path_entries(session, conversation_id, at, above=above)
    # Read to its start (the root, or a base where the prompt restarts), or only down to
    # the known head, or, forked below it (an edit, a regeneration), down to another branch.
    whole = not entries or entries[0].parent_seq is None or entries[0].role == BASE_ROLE
    extends = not whole and earlier is not None and entries[0].parent_seq == above
    if not whole and not extends and above >= 0:
        entries = await path_entries(session, conversation_id, at)
    if not entries:
        return None
    prompt = [earlier.prompt] if extends and earlier is not None else []
    last_assistant = earlier.last_assistant if extends and earlier is not None else b""
    for entry in entries:
        prompt.append(entry.token_ids)
        if entry.role == "assistant":
            last_assistant = entry.token_ids
    path = KnownPath(entries[-1].seq, b"".join(prompt), last_assistant, entries[-1].role)
    if known is not None:
        known.put(conversation_id, path)
    return path


def as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; they were written as UTC."""
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
