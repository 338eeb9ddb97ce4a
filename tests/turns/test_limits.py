"""Fair use: messages per minute and tokens per day, per key and per user, kept in the database."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from click.testing import CliRunner
from sqlalchemy import event, text

from bot.cli import main
from bot.http.keys import TURNS
from bot.storage.db import create_engine, create_sessionmaker, is_sqlite
from bot.turns.limits import (
    MESSAGES_PER_MINUTE,
    TOKENS_PER_DAY,
    FairUse,
    RateLimited,
    describe_wait,
    set_override,
    subjects_for,
)
from bot.turns.settings import LimitSettings
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, count_rows, read_sse


async def _post(client: Any, key: str, message_id: str, conversation: str = "c") -> Any:
    return await client.post(
        "/v1/messages",
        json={"conversation_id": conversation, "message_id": message_id, "text": "Hi"},
        headers=auth(key),
    )


async def _clear_of_minute_edge(margin_s: float = 8.0) -> None:
    """Fixed one-minute windows: do not start a per-minute test just before one ends."""
    into = time.time() % 60
    if into > 60 - margin_s:
        await asyncio.sleep(60 - into + 0.5)


async def test_over_the_message_limit_is_refused_with_when_to_retry(
    db_url: str, make_client: MakeClient
) -> None:
    await _clear_of_minute_edge()
    client = await make_client(db_url, limits={"messages_per_minute": 2})
    key = await issue_key(db_url)
    assert (await _post(client, key, "m1")).status == 202
    assert (await _post(client, key, "m2", conversation="other")).status == 202
    refused = await _post(client, key, "m3")
    assert refused.status == 429
    body = await refused.json()
    assert body["error"] == "rate_limited"
    assert body["limit"] == MESSAGES_PER_MINUTE
    assert 1 <= body["retry_after_s"] <= 60
    assert refused.headers["Retry-After"] == str(body["retry_after_s"])
    assert "try again in" in body["reason"]
    await client.server.app[TURNS].wait_idle(timeout=60)
    # Nothing of the refused message was stored: it may be sent again later.
    counts = await count_rows(db_url)
    assert counts["turns"] == 2 and counts["inbound_events"] == 2

    # Another key is not affected.
    other = await issue_key(db_url, "bob")
    assert (await _post(client, other, "m1")).status == 202
    await client.server.app[TURNS].wait_idle(timeout=60)


async def test_counters_survive_a_restart_and_hold_across_workers(
    db_url: str, make_client: MakeClient
) -> None:
    await _clear_of_minute_edge()
    limits = {"messages_per_minute": 5, "tokens_per_day": 0}
    workers = [await make_client(db_url, limits=limits)]
    if not is_sqlite(db_url):
        # A second worker on the same database (SQLite is single-process: `botctl serve`
        # refuses a second one there).
        workers.append(await make_client(db_url, limits=limits))
    key = await issue_key(db_url)
    responses = await asyncio.gather(
        *(_post(workers[i % len(workers)], key, f"m{i}", f"c{i}") for i in range(8))
    )
    assert sorted(r.status for r in responses) == [202] * 5 + [429] * 3
    for client in workers:
        await client.server.app[TURNS].wait_idle(timeout=120)
    # "Restart": a fresh app on the same database still counts this minute's messages.
    restarted = await make_client(db_url, limits=limits)
    assert (await _post(restarted, key, "late")).status == 429


async def test_tokens_per_day_are_charged_per_turn_and_persist(
    sqlite_url: str, make_client: MakeClient
) -> None:
    limits = {"messages_per_minute": 0, "tokens_per_day": 20}
    client = await make_client(sqlite_url, limits=limits)
    key = await issue_key(sqlite_url)
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": "c", "message_id": "m1", "text": "Hello"},
        headers={**auth(key), "Accept": "text/event-stream"},
    )
    done = (await read_sse(response))[-1]
    usage = done.data["usage"]
    charged = usage["prompt_tokens"] - usage["cached_tokens"] + usage["completion_tokens"]
    assert charged > 20

    restarted = await make_client(sqlite_url, limits=limits)
    refused = await _post(restarted, key, "m2")
    assert refused.status == 429
    body = await refused.json()
    assert body["limit"] == "tokens_per_day"
    seconds_to_midnight = 86_400 - time.time() % 86_400
    assert abs(body["retry_after_s"] - seconds_to_midnight) < 5
    assert "00:00 UTC" in body["reason"]

    # The admin sees the use, and raises this key's allowance with botctl.
    prefix = key.split("_")[1]
    shown = await _botctl(sqlite_url, "limits", "show", "--key", prefix)
    assert f"tokens_used_today={charged}" in shown
    await _botctl(sqlite_url, "limits", "set", "--key", prefix, "--tokens-per-day", "0")
    assert (await _post(restarted, key, "m3")).status == 202
    await restarted.server.app[TURNS].wait_idle(timeout=60)


async def _botctl(db_url: str, *args: str) -> str:
    # botctl runs its own event loop: keep it off the test's.
    result = await asyncio.to_thread(
        CliRunner().invoke, main, list(args), env={"BOT_DATABASE__URL": db_url}
    )
    assert result.exit_code == 0, result.output
    return result.output


async def test_botctl_overrides_one_key_only(db_url: str, make_client: MakeClient) -> None:
    await _clear_of_minute_edge()
    client = await make_client(db_url, limits={"messages_per_minute": 10})
    slow = await issue_key(db_url, "slow")
    fast = await issue_key(db_url, "fast")
    await _botctl(db_url, "limits", "set", "--key", "slow", "--messages-per-minute", "1")
    shown = await _botctl(db_url, "limits", "show")
    assert "messages_per_minute=1 " in shown and shown.startswith("default  messages_per_minute=")
    assert (await _post(client, slow, "m1")).status == 202
    assert (await _post(client, slow, "m2", "c2")).status == 429
    assert (await _post(client, fast, "m1")).status == 202
    assert (await _post(client, fast, "m2", "c2")).status == 202
    await _botctl(db_url, "limits", "clear", "--key", "slow")
    assert (await _post(client, slow, "m3", "c3")).status == 202
    await client.server.app[TURNS].wait_idle(timeout=60)


async def test_platform_users_are_limited_one_by_one(sqlite_url: str) -> None:
    """Without an API key, a message counts against its platform user."""
    now = [1_000_000.0 * 60]
    fair_use = FairUse(LimitSettings(messages_per_minute=2, tokens_per_day=0), lambda: now[0])
    alice = subjects_for(api_key_id=None, channel="telegram:support", user_id="42")
    bob = subjects_for(api_key_id=None, channel="telegram:support", user_id="43")
    assert alice == ["user:telegram:support:42"]
    engine = create_engine(sqlite_url)
    sessions = create_sessionmaker(engine)
    try:
        for _ in range(2):
            async with sessions() as session, session.begin():
                await fair_use.admit(await session.connection(), alice)
        try:
            async with sessions() as session, session.begin():
                await fair_use.admit(await session.connection(), alice)
        except RateLimited as exc:
            assert exc.refusal.retry_after_s == 60
            assert "60 seconds" in exc.refusal.user_message
        else:
            raise AssertionError("the third message in a minute was admitted")
        async with sessions() as session, session.begin():
            await fair_use.admit(await session.connection(), bob)
        now[0] += 60  # the next minute
        async with sessions() as session, session.begin():
            await fair_use.admit(await session.connection(), alice)
    finally:
        await engine.dispose()


async def test_admit_counts_refuses_and_rolls_back_on_every_backend(db_url: str) -> None:
    """The minute's allowance, the day's tokens, per-subject overrides either way; a
    message refused for its tokens takes nothing from its minute. On PostgreSQL each
    admit is one statement (one round trip on the accept's way to its ack)."""
    now = [1_000_000.0 * 60]
    limited = FairUse(LimitSettings(messages_per_minute=2, tokens_per_day=100), lambda: now[0])
    unlimited = FairUse(LimitSettings(messages_per_minute=0, tokens_per_day=0), lambda: now[0])
    engine = create_engine(db_url)
    sessions = create_sessionmaker(engine)
    statements: list[str] = []

    def sent(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    async def admit(fair_use: FairUse, subject: str) -> str | None:
        """The refused limit, or None; the statements it sent are in ``statements``."""
        statements.clear()
        try:
            async with sessions() as session, session.begin():
                await fair_use.admit(await session.connection(), [subject])
        except RateLimited as exc:
            return exc.refusal.limit
        return None

    async def messages_counted(subject: str) -> int | None:
        async with sessions() as session:
            return (
                await session.execute(
                    text("SELECT value FROM usage_counters WHERE subject = :s AND metric = :m"),
                    {"s": subject, "m": MESSAGES_PER_MINUTE},
                )
            ).scalar_one_or_none()

    event.listen(engine.sync_engine, "before_cursor_execute", sent)
    try:
        assert [await admit(limited, "key:a") for _ in range(3)] == [
            None,
            None,
            MESSAGES_PER_MINUTE,
        ]
        # One statement a subject on PostgreSQL; the standing, then the take, on SQLite.
        assert len(statements) == (2 if is_sqlite(db_url) else 1)
        assert await messages_counted("key:a") == 2
        now[0] += 60  # the next minute
        assert await admit(limited, "key:a") is None
        async with sessions() as session, session.begin():
            await limited.charge(session, ["key:a"], 100)
        assert await admit(limited, "key:a") == TOKENS_PER_DAY
        assert await messages_counted("key:a") == 1  # the refused message took nothing
        # An override lifts a limit (0: none) or sets one where the default has none.
        async with sessions() as session, session.begin():
            await set_override(session, "key:b", messages_per_minute=0, tokens_per_day=None)
            await set_override(session, "key:c", messages_per_minute=1, tokens_per_day=None)
        assert [await admit(limited, "key:b") for _ in range(4)] == [None] * 4
        assert await messages_counted("key:b") is None  # no limit, nothing counted
        assert [await admit(unlimited, "key:c") for _ in range(2)] == [None, MESSAGES_PER_MINUTE]
        assert [await admit(unlimited, "key:d") for _ in range(3)] == [None] * 3
        assert len(statements) == 1
        assert await messages_counted("key:d") is None
    finally:
        await engine.dispose()


async def test_turns_ending_together_charge_one_key_without_waiting_for_each_other(
    pg_url: str,
) -> None:
    """A turn's final write charges its tokens and holds the row it charged until it
    commits. Every turn of an API key charges that key: final writes in flight at once
    must not queue for one row (each would hold its conversation's row meanwhile)."""
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    day = [1_000_000 * 86_400.0]
    fair_use = FairUse(LimitSettings(tokens_per_day=1000), clock=lambda: day[0])
    try:
        async with sessions() as first, first.begin():
            await fair_use.charge(first, ["key:a"], 100)  # not committed yet
            async with asyncio.timeout(5), sessions() as second, second.begin():
                await second.execute(text("SET LOCAL lock_timeout = '1s'"))
                await fair_use.charge(second, ["key:a"], 250)
        for _ in range(10):  # every row a charge can go to, and back
            async with sessions() as session, session.begin():
                await fair_use.charge(session, ["key:a"], 1)
        async with sessions() as session:
            standing = await fair_use.standing(await session.connection(), "key:a", int(day[0]))
            assert standing.tokens_used == 360
            # The next day counts from nothing, whichever rows held the last one.
            day[0] += 86_400
            standing = await fair_use.standing(await session.connection(), "key:a", int(day[0]))
            assert standing.tokens_used == 0
    finally:
        await engine.dispose()


def test_waits_read_naturally() -> None:
    assert describe_wait(1) == "1 second"
    assert describe_wait(45) == "45 seconds"
    assert describe_wait(600) == "10 minutes"
    assert describe_wait(5 * 3600 + 120) == "5 h 2 min"
