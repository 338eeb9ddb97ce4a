"""Benchmark: what one accept costs the event loop, next to the same SQL sent plainly.

An accept is what every inbound message waits for before its ack: the fair-use
check, the conversation's next turn number, the turn and its inbound event, one
transaction (``TurnService.accept``). Here N of them run back to back in one
process with nothing else on its event loop, so the figures are the accept's
own cost: wall-clock and CPU time per accept, with the default fair-use limits
and with none, and of a conversation's first message (which creates it), also as a
new engine's first accept (every statement compiled for the first time, as after a
start), on SQLite and (``--database``) PostgreSQL.

Next to them, the floor: the same statements (as the service sends them), in
one transaction per message, straight through the driver (``sqlite3`` on the
loop's thread, ``asyncpg``), without SQLAlchemy or the service around them.

Last, both again with the CPU's caches emptied before each (64 MB read, not
timed): in the service a message's accept runs so, after the engine's steps
have streamed the model's weights through the cache both CPUs share, and costs
two to three times the figure of the tight loop above.

Run:  .venv/bin/python bench/accept.py
      .venv/bin/python bench/accept.py --database postgresql+asyncpg://127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from harness import add_database_servers, scratch_database
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.config import load_settings
from bot.storage.db import create_engine, create_sessionmaker, is_sqlite
from bot.storage.kept import kept_for_accepts
from bot.turns.inbound import InboundMessage
from bot.turns.limits import TOKEN_METRICS, FairUse
from bot.turns.service import TurnService
from bot.turns.streams import TurnStreams
from bot.warm_up import rehearsal_message

CONVERSATIONS = 40
# A subject's tokens today: the rows its day is spread over (``bot.turns.limits``).
TOKENS_USED = (
    "(SELECT coalesce(sum(CASE WHEN window_start = {3} THEN value ELSE 0 END), 0)"
    " FROM usage_counters WHERE subject = {0} AND metric IN ("
    + ", ".join(f"'{metric}'" for metric in TOKEN_METRICS)
    + "))"
)
STANDING = (
    "SELECT (SELECT messages_per_minute FROM limit_overrides WHERE subject = {0}),"
    " (SELECT tokens_per_day FROM limit_overrides WHERE subject = {0}), " + TOKENS_USED
)
TAKE_MESSAGE = (
    "INSERT INTO usage_counters (subject, metric, window_start, value)"
    " VALUES ({0}, 'messages_per_minute', {1}, 1) ON CONFLICT (subject, metric) DO UPDATE"
    " SET window_start = {1}, value = CASE WHEN usage_counters.window_start = {1}"
    " THEN usage_counters.value + 1 ELSE 1 END"
    " WHERE usage_counters.window_start != {1} OR usage_counters.value < {2} RETURNING value"
)
# PostgreSQL: the standing and the take in one statement, as ``bot.turns.limits`` sends them.
STANDING_AND_TAKE = (
    "WITH standing AS (SELECT"
    " (SELECT messages_per_minute FROM limit_overrides WHERE subject = {0}) AS messages,"
    " (SELECT tokens_per_day FROM limit_overrides WHERE subject = {0}) AS tokens, "
    + TOKENS_USED
    + " AS used),"
    " taken AS (INSERT INTO usage_counters (subject, metric, window_start, value)"
    " SELECT {0}, 'messages_per_minute', {1}, 1 FROM standing WHERE coalesce(messages, {2}) > 0"
    " ON CONFLICT (subject, metric) DO UPDATE"
    " SET window_start = {1}, value = CASE WHEN usage_counters.window_start = {1}"
    " THEN usage_counters.value + 1 ELSE 1 END"
    " WHERE usage_counters.window_start != {1}"
    " OR usage_counters.value < (SELECT coalesce(messages, {2}) FROM standing) RETURNING value)"
    " SELECT standing.*, (SELECT value FROM taken) FROM standing"
)
TAKE_SLOT = (
    "UPDATE conversations SET updated_at = {0}, next_turn_seq = next_turn_seq + 1"
    " WHERE owner = {1} AND channel = 'api' AND external_key = {2} AND closed_at IS NULL"
    " RETURNING id, persona, next_turn_seq"
)
INSERT_TURN = (
    "INSERT INTO turns (id, conversation_id, seq, channel, reply_to, user_id, user_name,"
    " user_text, status, layer_ms, created_at, api_key_id, attempt)"
    " VALUES ({0}, {1}, {2}, 'api', '{{}}', {3}, NULL, {4}, 'queued', '{{}}', {5}, NULL, 1)"
)
INSERT_EVENT = (
    "INSERT INTO inbound_events (channel, event_id, conversation_id, turn_id, received_at)"
    " VALUES ('api', {0}, {1}, {2}, {3})"
)
# PostgreSQL: the turn's INSERT a CTE of its event's, as ``bot.storage.queries`` sends them.
TURN_AND_EVENT = (
    "WITH new_turn AS (" + INSERT_TURN + " RETURNING id, conversation_id)"
    " INSERT INTO inbound_events (channel, event_id, conversation_id, turn_id, received_at)"
    " SELECT 'api', {6}, new_turn.conversation_id, new_turn.id, {5} FROM new_turn"
)

# PostgreSQL, a conversation that exists: the turn number, the turn and its event in one
# statement, as ``bot.storage.queries.place_turn`` sends them.
SLOT_TURN_AND_EVENT = (
    "WITH slot AS (" + TAKE_SLOT + "),"
    " new_turn AS (INSERT INTO turns (id, conversation_id, seq, channel, reply_to, user_id,"
    " user_name, user_text, status, layer_ms, created_at, api_key_id)"
    " SELECT {3}, slot.id, slot.next_turn_seq - 1, 'api', '{{}}', {4}, NULL, {5}, 'queued',"
    " '{{}}', {0}, NULL FROM slot WHERE {6}::varchar IS NULL OR slot.persona = {6}"
    " RETURNING id, conversation_id),"
    " event AS (INSERT INTO inbound_events (channel, event_id, conversation_id, turn_id,"
    " received_at) SELECT 'api', {7}, conversation_id, id, {0} FROM new_turn RETURNING turn_id)"
    " SELECT slot.id, slot.persona, slot.next_turn_seq, (SELECT count(*) FROM event) FROM slot"
)


def message(run: str, i: int, *, first: bool = False) -> InboundMessage:
    # A user of its own per message: the default limit of 30 a minute never refuses one.
    # ``first``: a conversation of its own too (a key's first message creates it).
    return InboundMessage(
        channel="api",
        event_id=f"{run}-{i}",
        owner="bench",
        conversation_key=f"{run}-new{i}" if first else f"{run}-c{i % CONVERSATIONS}",
        text="Hello there, how are you today?",
        user_id=f"{run}-u{i}",
    )


EVICTING_MB = 64
"""Read before each call of a cold line: twice the largest last-level cache seen here (32 MB)."""


async def timed(
    n: int, one: Callable[[int], Awaitable[None]], *, cold: bool = False
) -> tuple[float, float]:
    """Wall-clock and CPU ms per call of ``one``, after a warm-up of its own.

    ``cold``: ``EVICTING_MB`` read before each call (not timed), so that it runs with
    the CPU's caches holding none of its code or data, as a message does in the
    service while the engine is generating: each engine step streams the model's
    weights (260 MB for the default model) through the last-level cache that both
    CPUs share, and the loop runs other work between two messages.
    """
    for i in range(n, n + 200):
        await one(i)
    if not cold:
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(n):
            await one(i)
        return (time.perf_counter() - wall) / n * 1000, (time.process_time() - cpu) / n * 1000
    evicting = bytearray(EVICTING_MB * 1024 * 1024)
    cpu_s = wall_s = 0.0
    for i in range(n):
        evicting.find(b"\x01")  # reads every byte: none is 1
        cpu, wall = time.process_time(), time.perf_counter()
        await one(i)
        wall_s += time.perf_counter() - wall
        cpu_s += time.process_time() - cpu
    return wall_s / n * 1000, cpu_s / n * 1000


def accepting_service(engine: AsyncEngine, *, kept: bool = True) -> TurnService:
    """A ``TurnService`` that accepts as the app's does (its connection kept on SQLite,
    ``bot.storage.kept``, unless not ``kept``) and runs nothing."""
    service = TurnService(create_sessionmaker(engine), TurnStreams())
    service.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    if kept:
        service.kept_accepts = kept_for_accepts(engine)
    return service


async def disposed(engine: AsyncEngine, service: TurnService) -> None:
    if service.kept_accepts is not None:
        await service.kept_accepts.close()
    await engine.dispose()


async def service_accepts(
    url: str,
    n: int,
    *,
    fair_use: bool,
    first: bool = False,
    kept: bool = True,
    cold: bool = False,
) -> tuple[float, float]:
    engine = create_engine(url)
    service = accepting_service(engine, kept=kept)
    if fair_use:
        service.fair_use = FairUse(load_settings(None).limits)
    run = uuid.uuid4().hex[:8]
    # Every conversation exists already, as for all but a conversation's first message.
    for i in range(CONVERSATIONS):
        await service.accept(message(run, -1 - i))

    async def one(i: int) -> None:
        await service.accept(message(run, i, first=first))

    try:
        return await timed(n, one, cold=cold)
    finally:
        await disposed(engine, service)


async def cold_accepts(
    url: str, engines: int = 5, *, rehearsed: bool = False
) -> tuple[float, float]:
    """Wall-clock and CPU ms of a new engine's first accept (a conversation's first
    message), the median over ``engines``: as after a process's start, every statement
    on its way is compiled (and on PostgreSQL prepared) for the first time, and the
    pool's first connection is opened. ``rehearsed``: after the service's warm-up
    rehearsal of an accept (``bot.warm_up``), as the service starts."""
    walls, cpus = [], []
    for _ in range(engines):
        engine = create_engine(url)
        service = accepting_service(engine)
        service.fair_use = FairUse(load_settings(None).limits)
        if rehearsed:
            await service.rehearse(rehearsal_message())
        cpu, wall = time.process_time(), time.perf_counter()
        await service.accept(message(uuid.uuid4().hex[:8], 0, first=True))
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
        await disposed(engine, service)
    return statistics.median(walls), statistics.median(cpus)


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None).isoformat(" ")


async def plain_sqlite(url: str, n: int, *, cold: bool = False) -> tuple[float, float]:
    """The same transaction through ``sqlite3`` on this thread (WAL, synchronous=NORMAL)."""
    db = sqlite3.connect(make_url(url).database or "", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    sql = [s.format("?", "?", "?", "?", "?", "?") for s in (STANDING, TAKE_MESSAGE, TAKE_SLOT)]
    turn_sql = INSERT_TURN.format("?", "?", "?", "?", "?", "?")
    event_sql = INSERT_EVENT.format("?", "?", "?", "?")
    run = uuid.uuid4().hex[:8]

    async def one(i: int) -> None:
        m = message(run, i)
        subject = f"user:api:{m.user_id}"
        minute = int(time.time() // 60) * 60
        db.execute("BEGIN IMMEDIATE")
        day = int(time.time() // 86_400) * 86_400
        db.execute(sql[0], (subject, subject, day, subject)).fetchone()
        db.execute(sql[1], (subject, minute, minute, minute, minute, 30)).fetchone()
        row = db.execute(sql[2], (_now(), "bench", f"{run}-c{i % CONVERSATIONS}")).fetchone()
        if row is None:
            conversation, seq = uuid.uuid4().hex, 0
            db.execute(
                "INSERT INTO conversations (id, owner, channel, external_key, next_turn_seq,"
                " created_at, updated_at) VALUES (?, 'bench', 'api', ?, 1, ?, ?)",
                (conversation, f"{run}-c{i % CONVERSATIONS}", _now(), _now()),
            )
        else:
            conversation, seq = row[0], row[2] - 1
        turn_id = uuid.uuid4().hex
        db.execute(turn_sql, (turn_id, conversation, seq, m.user_id, m.text, _now()))
        db.execute(event_sql, (m.event_id, conversation, turn_id, _now()))
        db.execute("COMMIT")

    try:
        return await timed(n, one, cold=cold)
    finally:
        db.close()


async def plain_postgres(url: str, n: int, *, cold: bool = False) -> tuple[float, float]:
    """The same transaction through ``asyncpg`` (statements prepared once, as it caches them)."""
    import asyncpg

    parsed = make_url(url)
    db = await asyncpg.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username, database=parsed.database
    )
    placeholders = [f"${k}" for k in range(1, 9)]
    standing_and_take, take_slot, turn_and_event, slot_turn_and_event = (
        s.format(*placeholders)
        for s in (STANDING_AND_TAKE, TAKE_SLOT, TURN_AND_EVENT, SLOT_TURN_AND_EVENT)
    )
    run = uuid.uuid4().hex[:8]

    async def one(i: int) -> None:
        m = message(run, i)
        subject = f"user:api:{m.user_id}"
        minute = int(time.time() // 60) * 60
        now = dt.datetime.now(dt.UTC)
        async with db.transaction():
            day = int(time.time() // 86_400) * 86_400
            await db.fetchrow(standing_and_take, subject, minute, 30, day)
            key = f"{run}-c{i % CONVERSATIONS}"
            turn_id = uuid.uuid4().hex
            placed = await db.fetchrow(
                slot_turn_and_event, now, "bench", key, turn_id, m.user_id, m.text, None, m.event_id
            )
            if placed is not None:
                return
            # The conversation's first message: created, then its turn.
            row = await db.fetchrow(take_slot, now, "bench", key)
            if row is None:
                conversation, seq = uuid.uuid4().hex, 0
                await db.execute(
                    "INSERT INTO conversations (id, owner, channel, external_key, next_turn_seq,"
                    " created_at, updated_at) VALUES ($1, 'bench', 'api', $2, 1, $3, $3)",
                    conversation,
                    key,
                    now,
                )
            else:
                conversation, seq = row[0], row[2] - 1
            await db.execute(
                turn_and_event, turn_id, conversation, seq, m.user_id, m.text, now, m.event_id
            )

    try:
        return await timed(n, one, cold=cold)
    finally:
        await db.close()


async def main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-accept-"))
    servers: list[str | None] = [None, *args.database]
    print(f"# {args.n} accepts in a row per line, one process, {CONVERSATIONS} conversations;")
    print("# load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'database':<12} {'what':<44} {'wall ms':>8} {'cpu ms':>8}")
    for server in servers:
        async with scratch_database(workdir, server) as url:
            for name, (wall, cpu) in await measure(url, args.n):
                print(f"{'SQLite' if server is None else 'PostgreSQL':<12} {name:<44}", end="")
                print(f" {wall:>8.2f} {cpu:>8.2f}")


async def measure(url: str, n: int) -> list[tuple[str, tuple[float, float]]]:
    """Per line: what was timed, (wall ms, CPU ms) per accept."""
    rows = [
        ("accept, default fair-use limits", await service_accepts(url, n, fair_use=True)),
        (
            "  the same, a pooled connection each",
            await service_accepts(url, n, fair_use=True, kept=False),
        ),
        ("accept, no limits", await service_accepts(url, n, fair_use=False)),
        (
            "accept, a conversation's first message",
            await service_accepts(url, n, fair_use=True, first=True),
        ),
        ("the same on a new engine (cold), median of 5", await cold_accepts(url)),
        ("  after the warm-up's rehearsal", await cold_accepts(url, rehearsed=True)),
    ]
    plain, driver = (plain_sqlite, "sqlite3") if is_sqlite(url) else (plain_postgres, "asyncpg")
    rows.append((f"same SQL plainly through {driver}", await plain(url, n)))
    # Cold: the caches emptied before each (``timed``), as in the service under load.
    cold_n = max(1, n // 4)
    rows.append(
        (
            "accept, default limits, caches emptied first",
            await service_accepts(url, cold_n, fair_use=True, cold=True),
        )
    )
    rows.append((f"same SQL through {driver}, caches emptied", await plain(url, cold_n, cold=True)))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="accepts per line")
    add_database_servers(parser)
    asyncio.run(main(parser.parse_args()))
