"""The connection kept for the accepts (``bot.storage.kept``): kept while its transactions
succeed, given back when one fails, nothing left checked out once closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.http.keys import DB_ENGINES
from bot.storage.db import create_engine, create_sessionmaker, is_sqlite
from bot.storage.kept import KeptConnection, kept_for_accepts
from tests.conftest import MakeClient, issue_key, migrate
from tests.helpers import auth, count_rows


@pytest.fixture
async def sqlite_engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'bot.db'}"
    await migrate(url)
    engine = create_engine(url)
    yield engine
    await engine.dispose()


A_ROW = text(
    "INSERT INTO limit_overrides (subject, messages_per_minute, updated_at)"
    " VALUES (:s, 1, '2026-01-01')"
)
"""Any row will do: a fair-use override's."""


@pytest.fixture
async def kept(sqlite_engine: AsyncEngine) -> AsyncIterator[KeptConnection]:
    kept = kept_for_accepts(sqlite_engine)
    assert kept is not None
    yield kept
    await kept.close()  # again if the test did: nothing left checked out either way


def checked_out(engine: AsyncEngine) -> int:
    """How many of the pool's connections are checked out now."""
    count: int = engine.sync_engine.pool.checkedout()  # type: ignore[attr-defined]
    return count


def checkouts(engine: AsyncEngine) -> Callable[[], int]:
    """How many times the pool has handed a connection out since this call."""
    count = 0

    def counted(*_: Any) -> None:
        nonlocal count
        count += 1

    event.listen(engine.sync_engine.pool, "checkout", counted)
    return lambda: count


async def store(kept: KeptConnection, name: str) -> None:
    async with kept.begin() as connection:
        await connection.execute(
            A_ROW,
            {"s": name},
        )


async def stored(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as connection:
        rows = await connection.execute(text("SELECT subject FROM limit_overrides ORDER BY 1"))
        return [subject for (subject,) in rows]


async def test_its_transactions_run_on_one_connection_kept_between_them(
    sqlite_engine: AsyncEngine, kept: KeptConnection
) -> None:
    handed_out = checkouts(sqlite_engine)
    for i in range(5):
        await store(kept, f"s{i}")
    assert handed_out() == 1
    assert sqlite_engine.sync_engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    await kept.close()
    assert sqlite_engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert await stored(sqlite_engine) == [f"s{i}" for i in range(5)]


async def test_a_transaction_that_raises_is_rolled_back_and_gives_its_connection_back(
    sqlite_engine: AsyncEngine, kept: KeptConnection
) -> None:
    await store(kept, "a")
    with pytest.raises(RuntimeError):
        async with kept.begin() as connection:
            await connection.execute(A_ROW, {"s": "b"})
            raise RuntimeError("refused")
    assert sqlite_engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="UNIQUE"):
        await store(kept, "a")  # a duplicate: the database refuses it
    assert sqlite_engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    # Nothing left open: another connection writes at once, and the kept one goes on.
    async with create_sessionmaker(sqlite_engine)() as session, session.begin():
        await session.execute(A_ROW, {"s": "c"})
    await store(kept, "d")
    assert await stored(sqlite_engine) == ["a", "c", "d"]
    await kept.close()


async def test_a_transaction_cancelled_while_another_holds_the_write_lock_leaves_nothing_stuck(
    sqlite_engine: AsyncEngine, kept: KeptConnection
) -> None:
    await store(kept, "a")
    sessions = create_sessionmaker(sqlite_engine)
    async with sessions() as holder, holder.begin():
        # This process's writer queue's place and SQLite's write lock, held.
        await holder.execute(A_ROW, {"s": "h"})
        waiting = asyncio.create_task(store(kept, "b"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    await store(kept, "c")
    assert await stored(sqlite_engine) == ["a", "c", "h"]
    await kept.close()
    assert sqlite_engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_after_close_each_transaction_takes_a_pooled_connection_and_gives_it_back(
    sqlite_engine: AsyncEngine, kept: KeptConnection
) -> None:
    await store(kept, "a")
    await kept.close()
    await store(kept, "b")
    assert sqlite_engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert await stored(sqlite_engine) == ["a", "b"]


async def test_only_a_sqlite_file_keeps_one(db_url: str) -> None:
    memory = create_engine("sqlite+aiosqlite://")
    engine = create_engine(db_url)
    try:
        assert kept_for_accepts(memory) is None  # its one connection would be shared
        assert (kept_for_accepts(engine) is not None) == is_sqlite(db_url)
    finally:
        await memory.dispose()
        await engine.dispose()


async def test_the_service_gives_the_accepts_connection_back_as_it_stops(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    body = {"conversation_id": "c1", "message_id": "m1", "text": "Hello"}
    assert (await client.post("/v1/messages", json=body, headers=auth(key))).status == 202
    pool = client.app[DB_ENGINES].requests.sync_engine.pool
    await client.close()
    assert pool.checkedout() == 0
    assert (await count_rows(db_url))["turns"] == 1
