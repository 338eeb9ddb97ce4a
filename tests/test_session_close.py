"""A session gives its connection back as its ``async with`` ends (``PromptSession``).

SQLAlchemy closes a session at the end of ``async with`` in a task of its own: the pooled
connection stayed out for an event-loop iteration after the session's work was done, and on
a busy loop (SQLite, 50 messages/s) the acks waited seconds for a free connection. These
tests check that whatever runs next on the loop finds the connection back in the pool, and
that a close that has to wait for the database is still not abandoned by a cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bot.storage.db import create_engine, create_read_sessionmaker, create_sessionmaker


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url)
    yield engine
    await engine.dispose()


def _checked_out(engine: AsyncEngine) -> int:
    return engine.sync_engine.pool.checkedout()  # type: ignore[attr-defined,no-any-return]


async def _end(engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]) -> list[str]:
    """Run a read to the end of its session; what the loop ran before the caller went on."""
    ran: list[str] = []
    async with sessions() as session:
        await session.execute(text("SELECT 1"))
        asyncio.get_running_loop().call_soon(ran.append, "other work")
    assert _checked_out(engine) == 0, "the caller went on with the connection still out"
    return ran


async def test_a_committed_session_ends_without_waiting_for_the_loop(
    engine: AsyncEngine,
) -> None:
    """An accept's session: once committed, leaving it costs no turn of the event loop
    (each was tens of milliseconds of a busy loop on the ack's way)."""
    sessions = create_sessionmaker(engine)
    ran: list[str] = []
    async with sessions() as session:
        async with session.begin():
            await session.execute(text("SELECT 1"))
        asyncio.get_running_loop().call_soon(ran.append, "other work")
    assert ran == [], "leaving the session waited for the event loop"
    assert _checked_out(engine) == 0


async def test_a_turns_read_gives_its_connection_back_before_anything_else_runs(
    sqlite_url: str,
) -> None:
    """SQLite: a turn's own read (in place, on the loop's thread) ends without waiting."""
    engine = create_engine(sqlite_url)
    try:
        assert await _end(engine, create_read_sessionmaker(engine, in_place=True)) == []
        # A write session left without a commit rolls back in place too.
        assert await _end(engine, create_sessionmaker(engine)) == []
    finally:
        await engine.dispose()


async def test_a_close_that_waits_for_the_database_is_not_abandoned_when_cancelled(
    engine: AsyncEngine,
) -> None:
    """A read whose rollback is a trip to the database (PostgreSQL; SQLite's reads on
    aiosqlite's thread) is cancelled as its ``async with`` ends: the close still finishes
    and the connection is back in the pool, not lost with the cancelled task."""
    reads = create_read_sessionmaker(engine)

    async def read_then_cancelled() -> None:
        async with reads() as session:
            await session.execute(text("SELECT 1"))
            this = asyncio.current_task()
            assert this is not None
            asyncio.get_running_loop().call_soon(this.cancel)  # lands while the exit waits

    task = asyncio.create_task(read_then_cancelled())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _checked_out(engine) == 0
    async with reads() as session:  # and the pool still serves
        assert (await session.execute(text("SELECT 1"))).scalar_one() == 1
