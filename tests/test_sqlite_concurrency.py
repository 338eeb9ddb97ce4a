"""SQLite under concurrent read-then-write transactions: they queue, none fails as 'locked'."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import event, select, update

from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation


async def test_read_then_write_transactions_queue_instead_of_failing(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    sessions = create_sessionmaker(engine)
    async with sessions() as session, session.begin():
        session.add(Conversation(id="c", owner="o", channel="api", external_key="k"))

    async def bump() -> None:
        # Read, yield to the others (so they commit in between), then write.
        async with sessions() as session, session.begin():
            seq = await session.scalar(
                select(Conversation.next_turn_seq).where(Conversation.id == "c")
            )
            await asyncio.sleep(0.01)
            await session.execute(
                update(Conversation)
                .where(Conversation.id == "c")
                .values(next_turn_seq=(seq or 0) + 1)
            )

    try:
        await asyncio.gather(*(bump() for _ in range(20)))
        async with sessions() as session:
            final = await session.scalar(select(Conversation.next_turn_seq))
    finally:
        await engine.dispose()
    # Serialised: no lost update and no "database is locked".
    assert final == 20


async def test_writers_of_one_process_queue_before_sqlite_sees_them(sqlite_url: str) -> None:
    """No writer of this process waits in SQLite's busy handler (which polls with sleeps
    growing to 100 ms): with the busy timeout at 0 every contended BEGIN would fail."""
    engine = create_engine(sqlite_url)

    def no_busy_wait(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=0")
        cursor.close()

    event.listen(engine.sync_engine, "connect", no_busy_wait)
    sessions = create_sessionmaker(engine)
    async with sessions() as session, session.begin():
        session.add(Conversation(id="c", owner="o", channel="api", external_key="k"))

    async def bump(rollback: bool) -> None:
        async with sessions() as session:
            async with session.begin():
                await session.execute(
                    update(Conversation)
                    .where(Conversation.id == "c")
                    .values(next_turn_seq=Conversation.next_turn_seq + 1)
                )
                await asyncio.sleep(0.005)  # others arrive while this one holds the lock
                if rollback:
                    await session.rollback()
            async with engine.connect() as connection:  # a second transaction, no session
                await connection.execute(
                    update(Conversation)
                    .where(Conversation.id == "c")
                    .values(next_turn_seq=Conversation.next_turn_seq + 1)
                )
                await connection.commit()

    try:
        await asyncio.gather(*(bump(rollback=i % 3 == 0) for i in range(15)))
        async with sessions() as session:
            final = await session.scalar(select(Conversation.next_turn_seq))
    finally:
        await engine.dispose()
    assert final == 15 + 10
