"""API key checks under a burst: one lookup per key, whoever waits for it.

A checked key is trusted for a second; when that second is up, every request of a burst
that presents the key used to look it up at once, each holding a pooled connection while
its lookup waited for the database. On a loaded SQLite service that emptied the pool and
every ack waited seconds for a connection. These tests call ``authenticate`` with
read sessions that wait for the database (a trip to aiosqlite's thread on SQLite, a round
trip on PostgreSQL), the case where requests overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import event, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from structlog.testing import capture_logs

from bot.apikeys import (
    KEY_CHECK_TTL_S,
    REFRESH_EVERY_S,
    Principal,
    authenticate,
    keep_keys_fresh,
)
from bot.storage.db import (
    create_engine,
    create_read_sessionmaker,
    create_sessionmaker,
    is_sqlite,
    storage_unavailable,
)
from bot.storage.models import ApiKey, as_utc, utcnow
from tests.conftest import issue_key

BURST = 20


@dataclass
class KeyStore:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    reads: async_sessionmaker[AsyncSession]
    lookups: list[str]
    """Every statement that read the api_keys table."""
    looking_up: asyncio.Event
    """Set when the first of them goes to the database."""
    failures: list[Exception]
    """Raised, in order, by the next lookups that reach the database (an injected fault)."""


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[KeyStore]:
    engine = create_engine(db_url)
    lookups: list[str] = []
    looking_up = asyncio.Event()
    failures: list[Exception] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "api_keys" in statement:
            lookups.append(statement)
            looking_up.set()
            if failures:
                raise failures.pop(0)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    reads = create_read_sessionmaker(engine)
    yield KeyStore(engine, create_sessionmaker(engine), reads, lookups, looking_up, failures)
    await engine.dispose()


async def test_a_burst_with_one_key_looks_it_up_once(db_url: str, store: KeyStore) -> None:
    key = await issue_key(db_url, "burst")
    principals = await asyncio.gather(*(authenticate(store.reads, key) for _ in range(BURST)))
    assert all(isinstance(p, Principal) and p.owner == "key:burst" for p in principals)
    assert len(store.lookups) == 1, f"{len(store.lookups)} lookups for one key"


async def test_a_burst_of_a_wrong_key_is_refused_with_one_lookup(
    db_url: str, store: KeyStore
) -> None:
    key = await issue_key(db_url, "real")
    wrong = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    answers = await asyncio.gather(*(authenticate(store.reads, wrong) for _ in range(BURST)))
    assert answers == [None] * BURST
    assert len(store.lookups) == 1
    assert await authenticate(store.reads, key) is not None


async def test_requests_waiting_for_a_cancelled_lookup_still_get_their_answer(
    db_url: str, store: KeyStore
) -> None:
    """The request that asked first leaves (its client hung up) while the others wait."""
    key = await issue_key(db_url, "left")
    first = asyncio.create_task(authenticate(store.reads, key))
    await store.looking_up.wait()  # the first request's lookup is on its way to the database
    waiting = [asyncio.create_task(authenticate(store.reads, key)) for _ in range(5)]
    await asyncio.sleep(0)  # they find the lookup under way and wait for it
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    principals = await asyncio.gather(*waiting)
    assert all(isinstance(p, Principal) and p.owner == "key:left" for p in principals)
    assert len(store.lookups) == 2, "the waiters should share one lookup of their own"


async def test_a_lookup_the_database_fails_fails_for_its_waiters_and_is_not_remembered(
    db_url: str, store: KeyStore
) -> None:
    """The database fails the one lookup a burst shares: every request of the burst gets
    the error, as a lone lookup would (the request answers 503: the database did not
    answer, the key is not wrong), and the next request asks the database again instead
    of reusing the failure."""
    key = await issue_key(db_url, "fault")
    lost = OperationalError("SELECT api_keys", {}, Exception("server closed the connection"))
    assert storage_unavailable(lost)
    store.failures.append(lost)
    answers = await asyncio.gather(
        *(authenticate(store.reads, key) for _ in range(BURST)),
        return_exceptions=True,
    )
    assert len(store.lookups) == 1, "the burst should have shared the failing lookup"
    assert all(isinstance(a, OperationalError) for a in answers), answers
    principal = await authenticate(store.reads, key)
    assert isinstance(principal, Principal) and principal.owner == "key:fault"
    assert len(store.lookups) == 2


@contextlib.asynccontextmanager
async def kept_fresh(store: KeyStore) -> AsyncIterator[None]:
    """``keep_keys_fresh`` running, as in a serving app's lifetime."""
    task = asyncio.create_task(keep_keys_fresh(store.reads, store.sessions))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_key_in_use_is_checked_again_before_its_next_request_needs_it(
    db_url: str, store: KeyStore
) -> None:
    """A person's messages come seconds apart, more than the second a checked key is
    trusted: each would wait for its key's lookup. Kept fresh in the background, the
    key is found checked; only the background reads it."""
    key = await issue_key(db_url, "typist")
    async with kept_fresh(store):
        assert await authenticate(store.reads, key) is not None
        for _ in range(2):
            await asyncio.sleep(KEY_CHECK_TTL_S * 1.5)  # a person typing
            before = len(store.lookups)
            # A key found checked is answered without an await: nothing else runs meanwhile.
            principal = await authenticate(store.reads, key)
            assert isinstance(principal, Principal) and principal.owner == "key:typist"
            assert len(store.lookups) == before, "the request looked its key up itself"
        assert len(store.lookups) >= 3, "the background should have read the key meanwhile"


async def test_a_key_revoked_while_kept_fresh_is_refused_within_a_second(
    db_url: str, store: KeyStore
) -> None:
    key = await issue_key(db_url, "revoked")
    async with kept_fresh(store):
        assert await authenticate(store.reads, key) is not None
        await asyncio.sleep(KEY_CHECK_TTL_S * 1.5)  # refreshed at least once by now
        async with store.sessions() as session, session.begin():
            await session.execute(update(ApiKey).values(revoked_at=utcnow()))
        revoked_at = time.monotonic()
        while await authenticate(store.reads, key) is not None:
            assert time.monotonic() - revoked_at < KEY_CHECK_TTL_S, "still accepted"
            await asyncio.sleep(0.02)


async def test_a_key_found_checked_still_has_its_use_written_to_the_minute(
    db_url: str, store: KeyStore
) -> None:
    """``last_used_at`` is what ``botctl keys list`` shows: a key whose requests find it
    checked must still be recorded as used, when it was presented, not when it was
    checked again."""
    key = await issue_key(db_url, "shown")
    long_ago = utcnow() - dt.timedelta(minutes=10)

    async def last_used() -> dt.datetime:
        async with store.sessions() as session:
            stored = await session.scalar(select(ApiKey.last_used_at))
        assert stored is not None
        return as_utc(stored)

    assert await authenticate(store.reads, key) is not None
    async with kept_fresh(store):
        async with store.sessions() as session, session.begin():
            await session.execute(update(ApiKey).values(last_used_at=long_ago))
        presented = utcnow()
        before = len(store.lookups)
        assert await authenticate(store.reads, key) is not None
        assert len(store.lookups) == before, "looked up: its lookup, not the refresh, wrote"
        await asyncio.sleep(KEY_CHECK_TTL_S * 2)
        written = await last_used()
    assert (
        presented - dt.timedelta(seconds=0.1) <= written <= presented + dt.timedelta(seconds=0.1)
    ), (presented, written)


async def test_a_refresh_the_database_fails_leaves_the_requests_to_look_their_keys_up(
    db_url: str, store: KeyStore
) -> None:
    """The background read fails (the database went away): nothing is trusted longer for
    it, the key ages out and its next request looks it up itself; the failure is logged
    once, and the refreshes go on once the database answers."""
    key = await issue_key(db_url, "outage")
    lost = OperationalError("SELECT api_keys", {}, Exception("server closed the connection"))
    with capture_logs() as logs:
        async with kept_fresh(store):
            assert await authenticate(store.reads, key) is not None
            store.failures.append(lost)  # the next read of api_keys: the refresh's
            await asyncio.sleep(KEY_CHECK_TTL_S * 1.5)
            assert not store.failures, "the refresh should have failed by now"
            before = len(store.lookups)
            principal = await authenticate(store.reads, key)
            assert isinstance(principal, Principal) and principal.owner == "key:outage"
            assert len(store.lookups) == before + 1, "the key aged out: its request looks"
            await asyncio.sleep(REFRESH_EVERY_S * 6)  # past the back-off
    events = [entry["event"] for entry in logs if entry["event"].startswith("key_refresh")]
    assert events == ["key_refresh_failed", "key_refresh_recovered"], events


@contextlib.asynccontextmanager
async def api_keys_locked(db_url: str, engine: AsyncEngine) -> AsyncIterator[None]:
    """Another session holds what writing a key's ``last_used_at`` needs: SQLite's write
    lock (a plain ``sqlite3`` connection), or the key's row on PostgreSQL."""
    if is_sqlite(db_url):
        other = sqlite3.connect(make_url(db_url).database or "", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            other.execute("ROLLBACK")
            other.close()
        return
    async with engine.connect() as connection:
        await connection.execute(text("SELECT id FROM api_keys FOR UPDATE"))
        try:
            yield
        finally:
            await connection.rollback()


async def test_a_key_is_answered_without_waiting_for_its_use_to_be_written(
    db_url: str, store: KeyStore
) -> None:
    """``last_used_at`` is informational: a key's first request in a while is not held
    up by writing it (behind a lock another session holds, or just a write), and the
    background refresh writes it once it can."""
    key = await issue_key(db_url, "busy")
    async with kept_fresh(store):
        async with api_keys_locked(db_url, store.engine):
            principal = await asyncio.wait_for(authenticate(store.reads, key), timeout=2.0)
            assert principal is not None
        deadline = time.monotonic() + 10.0
        while True:
            async with store.sessions() as session:
                if await session.scalar(select(ApiKey.last_used_at)) is not None:
                    break
            assert time.monotonic() < deadline, "the key's use was never written"
            await asyncio.sleep(0.1)
