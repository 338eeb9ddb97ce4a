"""The SQLite driver adapter: writes without a trip to aiosqlite's thread, reads with one a
statement, the same results as sqlite3."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import aiosqlite
import pytest
import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bot.storage.db import IN_PLACE, READ_ONLY, create_engine


def _count_trips(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every function aiosqlite runs on its thread, in order."""
    trips: list[Any] = []
    original = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(fn)
        return await original(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    return trips


async def test_a_write_transaction_makes_no_trip_and_a_read_one_a_statement(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(sqlite_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
        trips = _count_trips(monkeypatch)
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO t (v) VALUES ('a')"))
            rows = (await conn.execute(text("SELECT v FROM t"))).all()
        assert rows == [("a",)]
        # BEGIN IMMEDIATE, INSERT, SELECT, COMMIT all ran on this thread; SQLAlchemy's
        # own COMMIT and the pool's rollback at checkin found no transaction.
        assert trips == []
        async with engine.execution_options(**{READ_ONLY: True}).connect() as conn:
            rows = (await conn.execute(text("SELECT v FROM t"))).all()
        assert rows == [("a",)]
        # BEGIN DEFERRED, SELECT, and the rollback that ends the read.
        assert len(trips) == 3, trips
        async with engine.begin() as conn:  # writing again after a read
            await conn.execute(text("INSERT INTO t (v) VALUES ('b')"))
        assert len(trips) == 3, trips
    finally:
        await engine.dispose()


async def test_a_read_asked_in_place_makes_no_trip_and_sees_what_was_committed(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(sqlite_url)
    in_place = engine.execution_options(**{READ_ONLY: True, IN_PLACE: True})
    other = sqlite3.connect(str(make_url(sqlite_url).database), isolation_level=None)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
        trips = _count_trips(monkeypatch)
        other.execute("BEGIN IMMEDIATE")  # another process writing: a reader waits for nobody
        other.execute("INSERT INTO t (v) VALUES ('uncommitted')")
        async with in_place.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 0
        other.commit()
        async with in_place.connect() as conn:
            rows = (await conn.execute(text("SELECT v FROM t"))).all()
        assert rows == [("uncommitted",)]
        assert trips == []
        async with engine.execution_options(**{READ_ONLY: True}).connect() as conn:
            await conn.execute(text("SELECT v FROM t"))  # not asked: on the thread
        assert len(trips) == 3, trips
    finally:
        other.close()
        await engine.dispose()


async def test_a_writer_waits_for_another_process_s_lock_off_the_loop(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the write lock (a botctl command, say) is waited for on
    aiosqlite's thread, under the busy timeout: the event loop goes on meanwhile."""
    engine = create_engine(sqlite_url)
    other = sqlite3.connect(str(make_url(sqlite_url).database), isolation_level=None)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def write() -> None:
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO t (v) VALUES ('mine')"))

    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"))
        trips = _count_trips(monkeypatch)
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO t (v) VALUES ('other')")
        ticking = asyncio.create_task(ticker())
        writer = asyncio.create_task(write())
        await asyncio.sleep(0.3)
        assert not writer.done()
        assert ticks >= 10  # the loop was not stopped by the wait
        other.commit()
        async with asyncio.timeout(3):
            await writer
        ticking.cancel()
        assert len(trips) == 1, trips  # BEGIN IMMEDIATE, on the thread; the rest here
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT v FROM t ORDER BY id"))).all()
        assert rows == [("other",), ("mine",)]
    finally:
        other.close()
        await engine.dispose()


async def test_results_are_those_of_sqlite3(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"))
            inserted = await conn.execute(text("INSERT INTO t (v) VALUES ('a')"))
            assert (inserted.rowcount, inserted.lastrowid) == (1, 1)
            many = await conn.execute(
                text("INSERT INTO t (v) VALUES (:v)"), [{"v": "b"}, {"v": "c"}]
            )
            assert many.rowcount == 2
            returned = await conn.execute(text("UPDATE t SET v = v || '!' RETURNING id, v"))
            assert list(returned.keys()) == ["id", "v"]
            assert sorted(returned.all()) == [(1, "a!"), (2, "b!"), (3, "c!")]
            updated = await conn.execute(text("UPDATE t SET v = 'x' WHERE id = 99"))
            assert updated.rowcount == 0
        with pytest.raises(sqlalchemy.exc.IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(text("INSERT INTO t (v) VALUES ('a!')"))
        async with engine.connect() as conn:
            streamed = await conn.stream(text("SELECT v FROM t ORDER BY id"))
            assert [row.v async for row in streamed] == ["a!", "b!", "c!"]
    finally:
        await engine.dispose()
