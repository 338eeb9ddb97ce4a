"""Statements run in place (``bot.storage.in_place``): what SQLAlchemy's execution would
store and raise, heard by the engine's listeners, and SQLAlchemy's execution elsewhere."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.storage import in_place
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation, InboundEvent, Message, Turn, new_id, table_of
from bot.storage.new_turns import take_turn_slot

TURNS = table_of(Turn)
EVENTS = table_of(InboundEvent)
INSERT_TURN = insert(TURNS)
INSERT_EVENT = insert(EVENTS)
INSERT_ENTRIES = insert(table_of(Message))


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url)
    yield engine
    await engine.dispose()


async def a_conversation(engine: AsyncEngine) -> str:
    async with create_sessionmaker(engine)() as session, session.begin():
        slot = await take_turn_slot(
            await session.connection(), owner="o", channel="api", external_key="k"
        )
    return slot.conversation_id


def a_turn(conversation_id: str, seq: int) -> dict[str, Any]:
    return {
        "id": new_id(),
        "conversation_id": conversation_id,
        "seq": seq,
        "channel": "api",
        "reply_to": {"chat": "Zoë 🌍", "thread": None, "n": [1, 2.5]},
        "user_id": "ユーザー",
        "user_name": None,
        "user_text": "a line\nand 'quotes' \"too\" \\ \x7f",
        "api_key_id": None,
        "status": "queued",
        "started_at": None,
        "layer_ms": {"ingress": 0.25},
        "created_at": dt.datetime(2026, 12, 6, 10, 1, 2, 345678, tzinfo=dt.UTC),
    }


def an_event(conversation_id: str, event_id: str, turn_id: str) -> dict[str, Any]:
    """An inbound event's columns but ``received_at`` (its model's default)."""
    return {
        "channel": "api",
        "event_id": event_id,
        "conversation_id": conversation_id,
        "turn_id": turn_id,
    }


def heard(engine: AsyncEngine) -> list[tuple[str, Any]]:
    """Every statement the engine's listeners hear, with its execution context."""
    statements: list[tuple[str, Any]] = []

    def listen(_conn: Any, _cursor: Any, statement: str, _p: Any, context: Any, _m: Any) -> None:
        statements.append((statement, context))

    event.listen(engine.sync_engine, "before_cursor_execute", listen)
    return statements


async def test_an_insert_in_place_stores_what_sqlalchemys_execution_stores(
    sqlite_url: str,
) -> None:
    engine = create_engine(sqlite_url)
    try:
        conversation_id = await a_conversation(engine)
        ours, theirs = a_turn(conversation_id, 1), a_turn(conversation_id, 2)
        statements = heard(engine)
        async with engine.begin() as connection:
            # The event's ``received_at`` and the turn's ``attempt``: the models' defaults.
            await in_place.execute(connection, INSERT_TURN, ours)
            await in_place.execute(
                connection, INSERT_EVENT, an_event(conversation_id, "e1", ours["id"])
            )
            await connection.execute(INSERT_TURN, theirs)
            await connection.execute(INSERT_EVENT, an_event(conversation_id, "e2", theirs["id"]))
        # The first two ran in place (no execution context), the same SQL as SQLAlchemy's.
        assert [context is None for _, context in statements] == [True, True, False, False]
        assert statements[0][0] == statements[2][0]
        assert statements[1][0] == statements[3][0]
    finally:
        await engine.dispose()

    raw = sqlite3.connect(make_url(sqlite_url).database or "")
    try:
        turns = raw.execute("SELECT * FROM turns ORDER BY seq").fetchall()
        received = raw.execute("SELECT received_at FROM inbound_events ORDER BY event_id")
        (ours_received,), (theirs_received,) = received.fetchall()
        names = [d[0] for d in raw.execute("SELECT * FROM turns").description]
    finally:
        raw.close()
    assert len(turns) == 2
    differ = {"id", "seq"}
    stored = [
        {name: value for name, value in zip(names, row, strict=True) if name not in differ}
        for row in turns
    ]
    assert stored[0] == stored[1]
    assert stored[0]["attempt"] == 1
    assert len(ours_received) == len(theirs_received)
    assert abs(
        dt.datetime.fromisoformat(ours_received) - dt.datetime.fromisoformat(theirs_received)
    ) < dt.timedelta(seconds=30)


def entries(conversation_id: str, first_seq: int) -> list[dict[str, Any]]:
    return [
        {
            "conversation_id": conversation_id,
            "seq": first_seq + n,
            "role": role,
            "text": "déjà vu\n🙂",
            "token_ids": bytes([n, 0, 255, 7]),
            "turn_id": None,
            "parent_seq": None if n == 0 else first_seq + n - 1,
        }
        for n, role in enumerate(("user", "assistant"))
    ]


async def test_many_rows_in_place_are_stored_as_sqlalchemys_executemany_stores_them(
    sqlite_url: str,
) -> None:
    engine = create_engine(sqlite_url)
    try:
        conversation_id = await a_conversation(engine)
        statements = heard(engine)
        async with engine.begin() as connection:
            await in_place.execute_many(connection, INSERT_ENTRIES, entries(conversation_id, 0))
            await connection.execute(INSERT_ENTRIES, entries(conversation_id, 10))
        assert [context is None for _, context in statements] == [True, False]
    finally:
        await engine.dispose()
    raw = sqlite3.connect(make_url(sqlite_url).database or "")
    try:
        cursor = raw.execute("SELECT * FROM messages ORDER BY seq")
        names = [d[0] for d in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        raw.close()
    assert len(rows) == 4
    differ = {"id", "seq", "parent_seq", "created_at"}
    ours, theirs = rows[:2], rows[2:]
    for mine, other in zip(ours, theirs, strict=True):
        assert {k: v for k, v in mine.items() if k not in differ} == {
            k: v for k, v in other.items() if k not in differ
        }
        assert len(mine["created_at"]) == len(other["created_at"])


async def test_a_duplicate_in_place_raises_sqlalchemys_integrity_error_and_stores_nothing(
    engine: AsyncEngine,
) -> None:
    conversation_id = await a_conversation(engine)
    first = a_turn(conversation_id, 1)
    async with engine.begin() as connection:
        await in_place.execute(connection, INSERT_TURN, first)
    with pytest.raises(IntegrityError):
        async with engine.begin() as connection:
            await in_place.execute(connection, INSERT_TURN, a_turn(conversation_id, 2))
            await in_place.execute(connection, INSERT_TURN, {**first, "seq": 3})
    async with engine.connect() as connection:
        seqs = (await connection.execute(select(TURNS.c.seq))).scalars().all()
    assert seqs == [1]  # the transaction's first insert was rolled back with it


async def test_a_listener_that_refuses_a_statement_in_place_rolls_its_transaction_back(
    engine: AsyncEngine,
) -> None:
    conversation_id = await a_conversation(engine)

    def refuse(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT INTO inbound_events"):
            raise OperationalError(statement, None, ConnectionResetError("injected"))

    event.listen(engine.sync_engine, "before_cursor_execute", refuse)
    turn = a_turn(conversation_id, 1)
    with pytest.raises(OperationalError):
        async with engine.begin() as connection:
            await in_place.execute(connection, INSERT_TURN, turn)
            await in_place.execute(
                connection, INSERT_EVENT, an_event(conversation_id, "e", turn["id"])
            )
    event.remove(engine.sync_engine, "before_cursor_execute", refuse)
    async with engine.connect() as connection:
        assert (await connection.execute(select(TURNS.c.id))).all() == []


async def test_a_statement_returning_what_its_type_must_convert_is_refused_in_place(
    sqlite_url: str,
) -> None:
    engine = create_engine(sqlite_url)
    try:
        async with engine.begin() as connection:
            with pytest.raises(ValueError, match="created_at"):
                await in_place.execute(connection, select(Conversation.created_at), {})
    finally:
        await engine.dispose()
