"""SQLite under concurrent read-then-write transactions: they queue, none fails as 'locked'."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
import warnings
from typing import Any

import pytest
from sqlalchemy import event, select, update
from sqlalchemy.engine import make_url

from bot.storage.db import SQLITE_BUSY_TIMEOUT_MS, create_engine, create_sessionmaker
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


async def write_one(sessions: Any) -> None:
    async with sessions() as session, session.begin():
        await session.execute(
            update(Conversation).values(next_turn_seq=Conversation.next_turn_seq + 1)
        )


async def test_a_writer_cancelled_mid_statement_is_cancelled_and_lets_the_next_one_in(
    sqlite_url: str,
) -> None:
    """The cancellation reaches the writer's task (it does not turn into another error
    its caller would log and go on from), and its place in the queue is given back once
    its connection is closed: the next writer does not wait for the busy timeout.

    A write transaction's statements run on the loop's thread and cannot be
    interrupted; its BEGIN can, while it waits on aiosqlite's thread for the write
    lock another process holds."""
    engine = create_engine(sqlite_url)
    sessions = create_sessionmaker(engine)
    async with sessions() as session, session.begin():
        session.add(Conversation(id="c", owner="o", channel="api", external_key="k"))
    other = sqlite3.connect(str(make_url(sqlite_url).database), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        writer = asyncio.create_task(write_one(sessions))
        await asyncio.sleep(0.1)  # inside its BEGIN, holding this process's writer place
        waiting = time.monotonic()
        follower = asyncio.create_task(write_one(sessions))
        writer.cancel()
        # The other process lets go soon after: the cancelled BEGIN returns, its
        # connection is closed, its place given back.
        asyncio.get_running_loop().call_later(0.3, other.rollback)
        with pytest.raises(asyncio.CancelledError):
            await writer
        await follower
        waited = time.monotonic() - waiting
        async with sessions() as session:
            final = await session.scalar(select(Conversation.next_turn_seq))
    finally:
        other.close()
        await engine.dispose()
    assert final == 1  # the cancelled write did nothing, the follower's committed
    assert waited < SQLITE_BUSY_TIMEOUT_MS / 1000 / 5


async def test_a_writer_cancelled_between_statements_rolls_back_and_lets_the_next_one_in(
    sqlite_url: str,
) -> None:
    engine = create_engine(sqlite_url)
    sessions = create_sessionmaker(engine)
    async with sessions() as session, session.begin():
        session.add(Conversation(id="c", owner="o", channel="api", external_key="k"))

    async def slow_writer() -> None:
        async with sessions() as session, session.begin():
            await session.execute(
                update(Conversation).values(next_turn_seq=Conversation.next_turn_seq + 1)
            )
            await asyncio.sleep(10)  # awaiting something else with the lock held

    try:
        writer = asyncio.create_task(slow_writer())
        await asyncio.sleep(0.1)
        waiting = time.monotonic()
        follower = asyncio.create_task(write_one(sessions))
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        await follower
        waited = time.monotonic() - waiting
        async with sessions() as session:
            final = await session.scalar(select(Conversation.next_turn_seq))
    finally:
        await engine.dispose()
    assert final == 1
    assert waited < 1


async def test_a_writer_dropped_unclosed_gives_back_its_place(sqlite_url: str) -> None:
    """A connection the garbage collector finds still in a transaction (its session was
    dropped, never closed) gives back its place in the writer queue, on the queue's own
    loop whichever thread the collector runs in: the writer waiting behind it goes on
    at once, not at the busy timeout (nor when something else happens to wake the loop)."""
    engine = create_engine(sqlite_url)
    sessions = create_sessionmaker(engine)
    async with sessions() as session, session.begin():
        session.add(Conversation(id="c", owner="o", channel="api", external_key="k"))
    dropped: list[Any] = []

    async def drop_a_write() -> None:
        session = sessions()
        await session.begin()
        await session.execute(
            update(Conversation).values(next_turn_seq=Conversation.next_turn_seq + 1)
        )
        dropped.append(session)  # and never closed nor rolled back

    collected: list[float] = []

    def collect() -> None:
        dropped.clear()
        gc.collect()
        # A full collection of this process (vLLM, the app) took seconds on a slow machine:
        # the follower is timed from its end, when the place was given back.
        collected.append(time.monotonic())

    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    try:
        with warnings.catch_warnings():
            # SQLAlchemy says so when it collects a connection that was not checked in.
            warnings.simplefilter("ignore")
            gc.disable()  # the collection below, in another thread, is the only one
            await drop_a_write()
            follower = asyncio.create_task(write_one(sessions))
            await asyncio.sleep(0.05)  # the follower waits for the dropped write's place
            loop.set_debug(True)  # a loop call from another thread raises, not races
            collector = threading.Thread(target=collect)
            collector.start()
            await asyncio.wait_for(follower, SQLITE_BUSY_TIMEOUT_MS / 1000 * 3)
            finished = time.monotonic()
            collector.join()
            waited = finished - collected[0]
    finally:
        loop.set_debug(debug)
        gc.enable()
        await engine.dispose()
    assert waited < SQLITE_BUSY_TIMEOUT_MS / 1000 / 5


async def test_the_pool_keeps_its_connection_and_says_nothing_when_it_resets_it(
    sqlite_url: str,
) -> None:
    """The writer queue's pool listeners take the arguments SQLAlchemy 2 passes: no
    deprecation warning at each reset (an error under the tests' warning filter, which
    made the pool invalidate the connection and open a new one for the next session)."""
    engine = create_engine(sqlite_url)
    connects: list[object] = []
    event.listen(engine.sync_engine, "connect", lambda *_: connects.append(None))
    sessions = create_sessionmaker(engine)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                await write_one(sessions)  # an empty table: the write changes no row
                async with sessions() as session:
                    await session.scalar(select(Conversation.id))
    finally:
        await engine.dispose()
    assert [str(w.message) for w in caught] == []
    assert len(connects) == 1
