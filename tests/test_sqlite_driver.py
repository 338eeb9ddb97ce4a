"""The SQLite driver adapter: one trip to aiosqlite's thread per statement, same results."""

from __future__ import annotations

from typing import Any

import aiosqlite
import pytest
import sqlalchemy.exc
from sqlalchemy import text

from bot.storage.db import create_engine


def _count_trips(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every function aiosqlite runs on its thread, in order."""
    trips: list[Any] = []
    original = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(fn)
        return await original(self, fn, *args, **kwargs)

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    return trips


async def test_a_statement_is_one_trip_and_an_idle_commit_none(
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
        # BEGIN IMMEDIATE, INSERT, SELECT, COMMIT (the writer queue's): SQLAlchemy's own
        # COMMIT and the pool's rollback at checkin find no transaction and stay here.
        assert len(trips) == 4, trips
    finally:
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
