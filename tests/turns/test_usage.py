"""Usage per owner, channel and UTC day, read from stored turns, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from bot.storage.db import create_engine, create_read_sessionmaker, create_sessionmaker
from bot.turns.limits import FairUse, set_override, user_subject
from bot.turns.settings import LimitSettings
from bot.turns.usage import UsageQuery, UsageReports, usage_rows
from tests.helpers import store_turns

# A fixed "now": 2026-03-10 00:30 UTC, half an hour into a day, so that a turn at
# 23:50 UTC the evening before belongs to the previous day in every time zone setting.
NOW = dt.datetime(2026, 3, 10, 0, 30, tzinfo=dt.UTC)
YESTERDAY_LATE = dt.datetime(2026, 3, 9, 23, 50, tzinfo=dt.UTC)
TODAY = NOW.date()


@pytest.fixture
async def sessions(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(db_url)
    try:
        yield create_sessionmaker(engine)
    finally:
        await engine.dispose()


async def _history(sessions: async_sessionmaker[AsyncSession]) -> None:
    tg = "telegram:support"
    await store_turns(
        sessions,
        owner=tg,
        channel=tg,
        key="chat:1",
        turns=[
            (YESTERDAY_LATE, "done", "42", 100, 0, 10),
            (NOW, "done", "42", 200, 96, 20),
            (NOW + dt.timedelta(minutes=1), "failed", "42", 300, 192, None),
            (NOW + dt.timedelta(minutes=2), "queued", "42", None, None, None),
        ],
    )
    await store_turns(
        sessions,
        owner=tg,
        channel=tg,
        key="chat:2",
        turns=[(NOW, "done", "7", 50, 0, 5)],
    )
    await store_turns(
        sessions,
        owner="alice",
        channel="api",
        key="c1",
        turns=[(NOW, "done", None, 80, 64, 8), (NOW, "done", None, 90, 80, 9)],
    )


async def test_usage_is_grouped_by_utc_day_owner_and_channel(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await _history(sessions)
    async with sessions() as session:
        rows = await usage_rows(session, UsageQuery())
    table = {(r.day, r.owner, r.channel): r for r in rows}
    assert set(table) == {
        (YESTERDAY_LATE.date(), "telegram:support", "telegram:support"),
        (TODAY, "telegram:support", "telegram:support"),
        (TODAY, "alice", "api"),
    }
    today_tg = table[(TODAY, "telegram:support", "telegram:support")]
    # The queued turn is not a finished turn and has no tokens yet.
    assert (today_tg.turns_done, today_tg.turns_failed) == (2, 1)
    assert (today_tg.prompt_tokens, today_tg.cached_tokens, today_tg.completion_tokens) == (
        550,
        288,
        25,
    )
    assert today_tg.cache_share == pytest.approx(288 / 550)
    yesterday = table[(YESTERDAY_LATE.date(), "telegram:support", "telegram:support")]
    assert (yesterday.turns_done, yesterday.prompt_tokens, yesterday.cache_share) == (1, 100, 0.0)
    alice = table[(TODAY, "alice", "api")]
    assert (alice.turns_done, alice.prompt_tokens, alice.cached_tokens) == (2, 170, 144)
    assert alice.as_dict()["day"] == TODAY.isoformat()


async def test_filters_and_grouping_by_user(sessions: async_sessionmaker[AsyncSession]) -> None:
    await _history(sessions)
    start = dt.datetime(2026, 3, 10, tzinfo=dt.UTC)
    async with sessions() as session:
        only_alice = await usage_rows(session, UsageQuery(owner="alice"))
        since_today = await usage_rows(
            session, UsageQuery(channels=("telegram:support",), since=start)
        )
        by_user = await usage_rows(
            session, UsageQuery(channels=("telegram:support",), since=start), by_user=True
        )
        one_user = await usage_rows(session, UsageQuery(user_id="7"))
        two_channels = await usage_rows(
            session, UsageQuery(channels=("api", "telegram:support"), since=start)
        )
        not_there = await usage_rows(session, UsageQuery(channels=("openai",)))
    assert [(r.owner, r.turns_done) for r in only_alice] == [("alice", 2)]
    assert [(r.day, r.turns_done, r.turns_failed) for r in since_today] == [(TODAY, 2, 1)]
    assert {(r.user_id, r.turns_done, r.prompt_tokens) for r in by_user} == {
        ("42", 1, 500),
        ("7", 1, 50),
    }
    assert [(r.user_id, r.prompt_tokens) for r in one_user] == [(None, 50)]
    assert {r.channel for r in two_channels} == {"api", "telegram:support"}
    assert not_there == []


async def test_today_shows_the_subjects_limit_and_what_was_counted_against_it(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await _history(sessions)
    clock = NOW.timestamp
    fair_use = FairUse(LimitSettings(tokens_per_day=1000), clock=clock)
    subject = user_subject("telegram:support", "42")
    async with sessions() as session, session.begin():
        await fair_use.charge(session, [subject], 132)
        await set_override(session, subject, messages_per_minute=None, tokens_per_day=5000)
    reports = UsageReports(sessions, fair_use, clock=clock)
    today = await reports.today(
        UsageQuery(owner="telegram:support", channels=("telegram:support",), user_id="42"),
        subject=subject,
    )
    assert today.day == TODAY
    assert (today.turns_done, today.turns_failed) == (1, 1)
    assert (today.prompt_tokens, today.cached_tokens, today.completion_tokens) == (500, 288, 20)
    assert (today.counted_tokens, today.tokens_per_day) == (132, 5000)
    assert today.as_dict()["cache_share"] == pytest.approx(288 / 500)

    other = await reports.today(
        UsageQuery(channels=("telegram:support",), user_id="7"),
        subject=user_subject("telegram:support", "7"),
    )
    assert (other.turns_done, other.counted_tokens, other.tokens_per_day) == (1, 0, 1000)
    day, everyone = await reports.today_by_user(
        owner="telegram:support", channel="telegram:support"
    )
    assert day == TODAY
    assert sorted(r.user_id or "" for r in everyone) == ["42", "7"]


async def test_reports_read_while_another_connection_holds_the_sqlite_write_lock(
    sqlite_url: str,
) -> None:
    engine = create_engine(sqlite_url)
    try:
        writes = create_sessionmaker(engine)
        await _history(writes)
        reports = UsageReports(create_read_sessionmaker(engine), None)
        async with writes() as holder, holder.begin():
            # BEGIN IMMEDIATE: this session holds the write lock until it ends.
            await holder.execute(text("UPDATE turns SET user_text = 'x' WHERE seq = 0"))
            started = time.perf_counter()
            rows = await asyncio.wait_for(reports.rows(UsageQuery()), timeout=3)
            assert time.perf_counter() - started < 1.0
        assert sum(r.turns_done for r in rows) == 5
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_days_are_utc_whatever_the_postgres_session_time_zone(pg_url: str) -> None:
    writer = create_engine(pg_url)
    await _history(create_sessionmaker(writer))
    await writer.dispose()
    tokyo = create_async_engine(
        pg_url, connect_args={"server_settings": {"timezone": "Asia/Tokyo"}}
    )
    try:
        async with create_sessionmaker(tokyo)() as session:
            rows = await usage_rows(session, UsageQuery(channels=("telegram:support",)))
    finally:
        await tokyo.dispose()
    # 23:50 UTC on the 9th is 08:50 on the 10th in Tokyo: it still counts for the 9th.
    assert [(r.day, r.turns_done) for r in rows] == [(YESTERDAY_LATE.date(), 1), (TODAY, 2)]
