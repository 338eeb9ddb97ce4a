"""Storage: the Alembic schema matches the models on both backends; token ids round-trip."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bot.storage.conversations import open_conversation
from bot.storage.db import create_engine, create_read_sessionmaker, create_sessionmaker
from bot.storage.migrate import downgrade, upgrade
from bot.storage.models import Base, Conversation, Turn
from bot.storage.tokens import pack_token_ids, unpack_token_ids
from tests.helpers import terminate_backends


def test_token_ids_round_trip_compactly() -> None:
    ids = [0, 1, 2047, 65535, 2**32 - 1]
    packed = pack_token_ids(ids)
    assert len(packed) == 4 * len(ids)
    assert unpack_token_ids(packed) == ids
    with pytest.raises(ValueError):
        unpack_token_ids(b"\x00\x01\x02")


def _diff(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


@pytest.mark.parametrize(
    "empty_db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_migrations_build_exactly_the_models_schema(empty_db_url: str) -> None:
    await asyncio.to_thread(upgrade, empty_db_url)
    engine = create_engine(empty_db_url)
    try:
        async with engine.connect() as connection:
            assert await connection.run_sync(_diff) == []
    finally:
        await engine.dispose()
    # And the way back works too.
    await asyncio.to_thread(downgrade, empty_db_url, "base")
    await asyncio.to_thread(upgrade, empty_db_url)


async def _simple_queries_of_one_session(
    engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]
) -> list[str]:
    """The simple-protocol queries (pings, BEGIN, COMMIT, ROLLBACK) that one session of
    ``sessions`` with one statement sends on a connection already in the pool."""
    async with engine.connect() as connection:
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
    sent: list[str] = []

    def log(record: Any) -> None:
        sent.append(record.query)

    driver.add_query_logger(log)
    try:
        async with sessions() as session:
            assert await session.scalar(select(func.count()).select_from(Turn)) == 0
        await asyncio.sleep(0)  # asyncpg hands its log records to the loop
    finally:
        driver.remove_query_logger(log)
    return sent


@pytest.mark.postgres
async def test_a_pooled_connection_is_checked_in_one_round_trip(pg_url: str) -> None:
    """The check that the server still holds a pooled connection is one ";", not
    SQLAlchemy's pre-ping (BEGIN, ";", ROLLBACK): two round trips fewer per session."""
    engine = create_engine(pg_url)
    try:
        sessions = create_sessionmaker(engine)
        assert await _simple_queries_of_one_session(engine, sessions) == [
            ";",
            "BEGIN;",
            "ROLLBACK;",
        ]
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_a_read_session_sends_no_begin_nor_rollback(pg_url: str) -> None:
    """Under READ COMMITTED a transaction gives reads nothing: a read session's statement
    goes alone, after the checkout's ping."""
    engine = create_engine(pg_url)
    try:
        for in_place in (False, True):
            sessions = create_read_sessionmaker(engine, in_place=in_place)
            assert await _simple_queries_of_one_session(engine, sessions) == [";"]
        # The setting stays with the read sessions: a writer's session on the same
        # connection still begins (naming the server's default level, which it restored).
        writes = create_sessionmaker(engine)
        ping, begin, rollback = await _simple_queries_of_one_session(engine, writes)
        assert (ping, rollback) == (";", "ROLLBACK;")
        assert begin in ("BEGIN;", "BEGIN ISOLATION LEVEL READ COMMITTED;")
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_a_connection_the_server_cut_is_replaced_at_checkout(pg_url: str) -> None:
    """A pooled connection the server closed (a restart, a cut) is found at checkout and
    replaced: the session's statement never sees it."""
    engine = create_engine(pg_url)
    try:
        async with create_sessionmaker(engine)() as session:
            assert await session.scalar(select(func.count()).select_from(Turn)) == 0
        assert await terminate_backends(pg_url, "true") == 1
        await asyncio.sleep(0.2)  # the cut reaches the client side
        async with create_sessionmaker(engine)() as session:
            assert await session.scalar(select(func.count()).select_from(Turn)) == 0
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_a_conversation_created_by_another_request_meanwhile_is_the_one_opened(
    pg_url: str,
) -> None:
    """Two requests open the same key's conversation at once: the second finds none,
    and its INSERT waits for the first's row; once that commits it creates nothing and
    opens the first's conversation (one open conversation per key, no error)."""
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    key = {"owner": "o", "channel": "api", "external_key": "k"}
    try:
        async with sessions() as first, sessions() as second, sessions() as probe:
            created = await open_conversation(first, **key)
            second_pid = await second.scalar(text("SELECT pg_backend_pid()"))
            opening = asyncio.create_task(open_conversation(second, **key))
            # Its own backend waiting on a lock (other sessions on the database may be too).
            async with asyncio.timeout(10):
                while (  # noqa: ASYNC110 - polled
                    await probe.scalar(
                        text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                        {"pid": second_pid},
                    )
                    != "Lock"
                ):
                    await asyncio.sleep(0.02)
            await first.commit()
            opened = await opening
            await second.commit()
            assert opened.id == created.id
            assert await probe.scalar(select(func.count()).select_from(Conversation)) == 1
    finally:
        await engine.dispose()
