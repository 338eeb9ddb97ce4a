"""The writes on a turn's way, kept few: each one on SQLite queues for the one write lock.

An accept takes its conversation's turn number in the statement that finds the
conversation; a turn to an idle conversation is stored running by its accept, one
queued behind another starts with one locked update; each ends with another; the
claims only read. These tests hold the promises those merged writes carry (a
refused accept stores nothing, numbers stay gapless) and count the write
transactions, which a new read in a write session would add to.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import re
from typing import Any

import asyncpg
import pytest
import structlog
from aiohttp.test_utils import TestClient
from sqlalchemy import event, make_url, text

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import SESSIONS, TURNS
from bot.storage.db import READ_ONLY, create_engine, create_sessionmaker, is_sqlite
from bot.storage.models import TurnStatus
from bot.turns import wakeups
from bot.turns.accepting import Accepted, limit_subjects
from bot.turns.inbound import InboundMessage
from bot.turns.limits import DAY_S, MESSAGES_PER_MINUTE, TOKENS_PER_DAY, FairUse
from bot.turns.service import TurnService
from bot.turns.settings import LimitSettings
from bot.turns.streams import TurnStreams
from tests.conftest import MakeClient, issue_key
from tests.engines import SlowEngine
from tests.helpers import (
    app_sync_engines,
    auth,
    count_rows,
    load_turns,
    plain_executes,
    read_sse,
    recorded_statements,
)
from tests.turns.conftest import WriteFaults

# The turn number's UPDATE, alone or (PostgreSQL, a conversation that exists) as the CTE
# the turn's INSERT selects from.
TURN_SLOT = r"^(?:WITH slot AS\s*\()?UPDATE conversations SET .*next_turn_seq"
NEXT_CLAIM = r"^UPDATE turns SET lease_owner=\S+, lease_expires_at=\(now\(\)"
START = r"^UPDATE turns SET (?:(?! WHERE ).)*\bstarted_at="
FINISH = r"^UPDATE turns SET (?:(?! WHERE ).)*\bfinished_at="


async def send(client: TestClient[Any, Any], key: str, message_id: str) -> Any:
    body = {"conversation_id": "c1", "message_id": message_id, "text": "Hello"}
    return await client.post("/v1/messages", json=body, headers=auth(key))


async def final_kind(client: TestClient[Any, Any], key: str, turn_id: str) -> str:
    async with asyncio.timeout(60):
        events = await read_sse(await client.get(f"/v1/turns/{turn_id}/events", headers=auth(key)))
    return events[-1].kind


async def messages_counted(db_url: str) -> dict[str, int]:
    """Each fair-use subject's messages counted in its current minute."""
    engine = create_engine(db_url)
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(
                text(
                    "SELECT subject, value FROM usage_counters WHERE metric = 'messages_per_minute'"
                )
            )
            return {subject: int(value) for subject, value in rows}
    finally:
        await engine.dispose()


async def answered(client: TestClient[Any, Any], key: str, message_id: str) -> None:
    """Send a message, read its turn to the end (done) and wait until the worker is idle."""
    accepted = await send(client, key, message_id)
    assert await final_kind(client, key, (await accepted.json())["turn_id"]) == "done"
    await client.app[TURNS].wait_idle(30)


# Each statement of an accept, in its order on SQLite; on PostgreSQL a conversation's later
# messages are one statement holding them all (each pattern fails that one).
ACCEPT_STATEMENTS = {
    "turn_number": TURN_SLOT,
    "fair_use_standing": r"FROM limit_overrides",
    "fair_use_take": r"INSERT INTO usage_counters",
    "turn": r"INSERT INTO turns",
    "inbound_event": r"INSERT INTO inbound_events",
}


@pytest.mark.parametrize("failing", ACCEPT_STATEMENTS)
async def test_an_accept_refused_at_any_of_its_statements_stores_nothing_and_numbers_stay_gapless(
    db_url: str, make_client: MakeClient, faults: list[WriteFaults], failing: str
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    first = await send(client, key, "m1")
    assert first.status == 202
    assert await final_kind(client, key, (await first.json())["turn_id"]) == "done"

    taken = await messages_counted(db_url)
    assert taken and set(taken.values()) == {1}
    fault.fail(ACCEPT_STATEMENTS[failing], times=1)
    refused = await send(client, key, "m2")
    assert refused.status == 503
    assert fault.raised == 1
    counts = await count_rows(db_url)
    assert (counts["turns"], counts["inbound_events"], counts["conversations"]) == (1, 1, 1)
    assert await messages_counted(db_url) == taken  # fair use's take rolled back with the rest

    retried = await send(client, key, "m2")
    assert retried.status == 202
    body = await retried.json()
    assert body["duplicate"] is False
    assert await final_kind(client, key, body["turn_id"]) == "done"
    turns = await load_turns(db_url)
    assert [(t.seq, t.status) for t in turns] == [(0, TurnStatus.DONE), (1, TurnStatus.DONE)]
    # A redelivery of the accepted message is still recognised.
    again = await send(client, key, "m2")
    assert (await again.json())["duplicate"] is True
    assert (await count_rows(db_url))["turns"] == 2


async def test_on_sqlite_a_turn_takes_the_write_lock_to_be_accepted_and_ended_only(
    db_url: str, make_client: MakeClient
) -> None:
    if not is_sqlite(db_url):
        return  # PostgreSQL has row locks: no one write lock to queue on
    client = await make_client(db_url)
    key = await issue_key(db_url)
    await answered(client, key, "m0")

    # Each transaction as it begins (a write one takes the lock at BEGIN), then its
    # statements: a write transaction's BEGIN is not a statement SQLAlchemy sees.
    sync_engine = client.app[SESSIONS].kw["bind"].sync_engine
    with recorded_statements(sync_engine) as log:

        def begin(conn: Any) -> None:
            read = conn.get_execution_options().get(READ_ONLY)
            log.append("BEGIN (read)" if read else "BEGIN")

        event.listen(sync_engine, "begin", begin)
        try:
            await answered(client, key, "m1")
        finally:
            event.remove(sync_engine, "begin", begin)

    # Accept (which began the turn: the conversation was idle) and final write; the
    # claims' and the history's reads begin deferred. The keys' bookkeeping in the
    # background (``bot.apikeys``: last used, every half second) is not the turn's: on a
    # slow machine it fell within the turn.
    turns_writes = [
        statement
        for begin, statement in itertools.pairwise(log)
        if begin == "BEGIN" and not statement.startswith("UPDATE api_keys")
    ]
    assert len(turns_writes) == 2, log
    assert not [statement for statement in log if re.match(START, statement)], log


async def test_a_conversations_next_turn_reads_its_head_and_not_its_path(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    for message_id in ("m0", "m1"):
        await answered(client, key, message_id)

    with recorded_statements(*app_sync_engines(client.app)) as statements:
        await answered(client, key, "m2")

    # The entries the last turn stored are known since its final write committed: no walk
    # of the path (one recursive query). Its head: on SQLite, where a turn to an idle
    # conversation is stored running by its accept, the accept's turn number statement
    # returns it and the run reads nothing; on PostgreSQL the run reads it.
    head_reads = [s for s in statements if s.startswith("SELECT conversations.head_seq")]
    assert len(head_reads) == (0 if is_sqlite(db_url) else 1), statements
    if is_sqlite(db_url):
        slots = [s for s in statements if re.match(TURN_SLOT, s)]
        assert len(slots) == 1 and "head_seq" in slots[0].partition("RETURNING")[2], slots
    assert not [s for s in statements if "RECURSIVE" in s], statements
    assert [t.status for t in await load_turns(db_url)] == [TurnStatus.DONE] * 3


async def test_a_stop_sent_as_the_ack_arrives_stops_a_turn_its_accept_began_once(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    client = await make_client(db_url, engine_override=SlowEngine(engine, 0.05))
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        accepted = await (await send(client, key, "m1")).json()
        cancel = await client.post(f"/v1/turns/{accepted['turn_id']}/cancel", headers=auth(key))
        assert (await cancel.json())["cancelled"] is True
        async with asyncio.timeout(60):
            events = await read_sse(
                await client.get(f"/v1/turns/{accepted['turn_id']}/events", headers=auth(key))
            )
        assert events[-1].kind == "error" and events[-1].data["error_class"] == "cancelled"
        after = await (await send(client, key, "m2")).json()
        assert await final_kind(client, key, after["turn_id"]) == "done"
    turns = await load_turns(db_url)
    assert [(t.status, t.error_class) for t in turns] == [
        (TurnStatus.FAILED, "cancelled"),
        (TurnStatus.DONE, None),
    ]
    lines = [e for e in logs if e.get("event") == "turn"]
    assert [line["turn_id"] for line in lines] == [accepted["turn_id"], after["turn_id"]]


async def test_a_message_sent_while_its_conversation_generates_waits_and_is_answered_next(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    slow = SlowEngine(engine, 0.05)
    client = await make_client(db_url, engine_override=slow)
    key = await issue_key(db_url)
    first = await (await send(client, key, "m1")).json()
    second = await (await send(client, key, "m2")).json()
    third = await (await send(client, key, "m3")).json()
    slow.pause_s = 0.0
    for accepted in (first, second, third):
        assert await final_kind(client, key, accepted["turn_id"]) == "done"
    turns = await load_turns(db_url)
    assert [t.status for t in turns] == [TurnStatus.DONE] * 3
    # One after another, in order: each started once the one before had ended.
    for before, after in itertools.pairwise(turns):
        assert before.finished_at is not None and after.started_at is not None
        assert after.started_at >= before.finished_at


FAIR_USE_NOW = 1_800_000_030.0
"""Half a minute into a minute: a test's messages all count in the same one."""


def message(event_id: str, persona: str | None = None) -> InboundMessage:
    """A message of user u to conversation c over the API (the accept-level tests)."""
    return InboundMessage(
        channel="api",
        event_id=event_id,
        owner="o",
        conversation_key="c",
        text="Hi",
        user_id="u",
        persona=persona,
    )


async def test_an_accept_is_one_statement_on_postgresql_and_a_redelivery_is_still_found(
    db_url: str,
) -> None:
    """Each statement of an accept is a round trip on PostgreSQL, which the ack waits
    for, and so are BEGIN and COMMIT: fair use (its standing and its take), the turn
    number, the turn and its inbound event are one statement, outside a transaction.
    SQLite, with no trips to save, sends them one by one in a transaction. A key's
    first message creates its conversation in that one statement on PostgreSQL; on
    SQLite it looks for it, then creates it, with no savepoint."""
    engine = create_engine(db_url)
    service = TurnService(
        create_sessionmaker(engine), TurnStreams(), fair_use=FairUse(LimitSettings())
    )
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine

    try:
        with recorded_statements(engine.sync_engine) as statements:
            created = await service.accept(message("m1"))  # creates the conversation
        looks = [s for s in statements if re.match(TURN_SLOT, s, re.DOTALL)]
        assert len(looks) == 1, statements
        assert not [s for s in statements if "SAVEPOINT" in s], statements
        assert len(statements) == (6 if is_sqlite(db_url) else 1), statements
        with plain_executes() as plain, recorded_statements(engine.sync_engine) as statements:
            accepted = await service.accept(message("m2"))
        assert not accepted.duplicate
        assert accepted.conversation_id == created.conversation_id
        assert len(statements) == (5 if is_sqlite(db_url) else 1), statements
        assert plain == [], plain  # no BEGIN, no COMMIT (nothing at all, on SQLite)
        again = await service.accept(message("m2"))
        assert again.duplicate and again.turn_id == accepted.turn_id
        counts = await count_rows(db_url)
        assert (counts["turns"], counts["inbound_events"]) == (2, 2)
        turns = await load_turns(db_url)
        assert [(t.seq, t.status, t.attempt) for t in turns] == [
            (0, TurnStatus.QUEUED, 1),
            (1, TurnStatus.QUEUED, 1),
        ]
    finally:
        await engine.dispose()


async def test_a_message_its_one_statement_does_not_store_leaves_nothing_behind(
    pg_url: str,
) -> None:
    """The accept's one statement runs outside a transaction and takes the turn number
    and the minute's count before it knows whether the turn goes in: one it does not
    store (another persona, over the limit) must leave no number, count or row behind,
    and is refused as before."""
    engine = create_engine(pg_url)
    service = TurnService(
        create_sessionmaker(engine),
        TurnStreams(),
        fair_use=FairUse(LimitSettings(messages_per_minute=3), clock=lambda: FAIR_USE_NOW),
    )
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    try:
        for event_id in ("m1", "m2"):
            assert not (await service.accept(message(event_id))).duplicate
        conflict = await service.accept(message("m3", persona="pirate"))
        assert conflict.persona_conflict is not None
        assert not (await service.accept(message("m4"))).duplicate
        over = await service.accept(message("m5"))
        assert over.rate_limited is not None and over.rate_limited.limit == MESSAGES_PER_MINUTE
        async with engine.connect() as connection:
            next_seq = await connection.scalar(text("SELECT next_turn_seq FROM conversations"))
            counted = await connection.scalar(
                text("SELECT value FROM usage_counters WHERE metric = :metric"),
                {"metric": MESSAGES_PER_MINUTE},
            )
        assert (next_seq, counted) == (3, 3)
        assert [t.seq for t in await load_turns(pg_url)] == [0, 1, 2]
        counts = await count_rows(pg_url)
        assert (counts["turns"], counts["inbound_events"]) == (3, 3)
    finally:
        await engine.dispose()


async def test_a_first_message_its_one_statement_does_not_store_creates_no_conversation(
    pg_url: str,
) -> None:
    """A key's first message creates its conversation inside the one statement: refused
    there (over the minute's limit), the conversation goes with the rest, and the
    transaction that tells the refusal apart leaves none either."""
    engine = create_engine(pg_url)
    service = TurnService(
        create_sessionmaker(engine),
        TurnStreams(),
        fair_use=FairUse(LimitSettings(messages_per_minute=1), clock=lambda: FAIR_USE_NOW),
    )
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    try:
        assert not (await service.accept(message("m1"))).duplicate
        elsewhere = dataclasses.replace(message("m2"), conversation_key="c2")
        with recorded_statements(engine.sync_engine) as statements:
            over = await service.accept(elsewhere)
        assert over.rate_limited is not None and over.rate_limited.limit == MESSAGES_PER_MINUTE
        assert statements[0].startswith("WITH slot AS"), statements[0]
        counts = await count_rows(pg_url)
        assert (counts["conversations"], counts["turns"], counts["inbound_events"]) == (1, 1, 1)
    finally:
        await engine.dispose()


HELD_CONVERSATION = (
    "INSERT INTO conversations (id, owner, channel, external_key, created_at, updated_at,"
    " next_turn_seq) VALUES ('held', 'o', 'api', 'c', now(), now(), 0)"
)


@pytest.mark.parametrize("held_ends", ["commit", "rollback"])
async def test_a_first_message_racing_another_creation_of_its_conversation_is_stored_once(
    pg_url: str, held_ends: str
) -> None:
    """Another session is creating the key's conversation, uncommitted, as the one
    statement runs: it waits on the unique index. Committed, the turn goes into that
    conversation (the statement creates none, the transaction finds it); rolled back,
    the statement creates the conversation itself."""
    engine = create_engine(pg_url)
    service = TurnService(create_sessionmaker(engine), TurnStreams())
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    try:
        async with engine.connect() as holder, engine.connect() as probe:
            # (Each poll in a transaction of its own: one's view of the activity is fixed.)
            await probe.execution_options(isolation_level="AUTOCOMMIT")
            await holder.execute(text(HELD_CONVERSATION))
            accepting = asyncio.create_task(service.accept(message("m1")))
            async with asyncio.timeout(10):
                while not await probe.scalar(text(WAITING_FOR_A_LOCK)):  # noqa: ASYNC110 - polled
                    await asyncio.sleep(0.01)
            assert not accepting.done()
            await (holder.commit() if held_ends == "commit" else holder.rollback())
        accepted = await asyncio.wait_for(accepting, 10)
        assert not accepted.duplicate
        assert (accepted.conversation_id == "held") == (held_ends == "commit")
        counts = await count_rows(pg_url)
        assert (counts["conversations"], counts["turns"], counts["inbound_events"]) == (1, 1, 1)
        assert [(t.conversation_id, t.seq) for t in await load_turns(pg_url)] == [
            (accepted.conversation_id, 0)
        ]
    finally:
        await engine.dispose()


async def test_a_message_over_its_days_tokens_is_refused_and_its_one_statement_leaves_nothing(
    pg_url: str,
) -> None:
    """The one statement checks the subject's tokens today too: a message from a user
    whose day is spent takes no turn number and no minute's count, stores nothing, and
    is refused for its tokens, with the time to the next day."""
    engine = create_engine(pg_url)
    fair_use = FairUse(
        LimitSettings(messages_per_minute=10, tokens_per_day=100), clock=lambda: FAIR_USE_NOW
    )
    service = TurnService(create_sessionmaker(engine), TurnStreams(), fair_use=fair_use)
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    try:
        assert not (await service.accept(message("m1"))).duplicate  # creates the conversation
        async with create_sessionmaker(engine)() as session, session.begin():
            await fair_use.charge(session, limit_subjects(message("m1")), 100)
        with recorded_statements(engine.sync_engine) as statements:
            spent = await service.accept(message("m2"))
        assert spent.rate_limited is not None, spent
        assert spent.rate_limited.limit == TOKENS_PER_DAY
        assert spent.rate_limited.retry_after_s == DAY_S - FAIR_USE_NOW % DAY_S
        # The one statement ran first (and undid itself); the transaction told the refusal.
        assert statements[0].startswith("WITH slot AS"), statements[0]
        async with engine.connect() as connection:
            next_seq = await connection.scalar(text("SELECT next_turn_seq FROM conversations"))
            counted = await connection.scalar(
                text("SELECT value FROM usage_counters WHERE metric = :metric"),
                {"metric": MESSAGES_PER_MINUTE},
            )
        assert (next_seq, counted) == (1, 1)
        counts = await count_rows(pg_url)
        assert (counts["turns"], counts["inbound_events"]) == (1, 1)
    finally:
        await engine.dispose()


async def test_a_message_with_no_key_and_no_user_counts_against_its_conversation(
    pg_url: str,
) -> None:
    """A message with no key and no user (a webhook that names no sender) counts against
    its conversation: the one statement stores and counts it, and the conversation's
    message over its minute is refused and stores nothing."""
    engine = create_engine(pg_url)
    service = TurnService(
        create_sessionmaker(engine),
        TurnStreams(),
        fair_use=FairUse(
            LimitSettings(messages_per_minute=2, tokens_per_day=1_000_000),
            clock=lambda: FAIR_USE_NOW,
        ),
    )
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    anonymous = [dataclasses.replace(message(f"m{i}"), user_id=None) for i in range(3)]
    assert limit_subjects(anonymous[0]) == ["conversation:api:c"]
    try:
        for i, each in enumerate(anonymous[:2]):
            with plain_executes() as plain, recorded_statements(engine.sync_engine) as statements:
                accepted = await service.accept(each)
            assert accepted.rate_limited is None and not accepted.duplicate
            if i:  # the first creates the conversation, in a transaction
                assert (len(statements), plain) == (1, []), (statements, plain)
        refused = await service.accept(anonymous[2])
        assert refused.rate_limited is not None
        assert [t.seq for t in await load_turns(pg_url)] == [0, 1]
        async with engine.connect() as connection:
            counted = await connection.scalar(
                text("SELECT value FROM usage_counters WHERE metric = :metric"),
                {"metric": MESSAGES_PER_MINUTE},
            )
        assert counted == 2
    finally:
        await engine.dispose()


WAITING_FOR_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
)


async def test_the_conversation_is_locked_before_the_fair_use_counter_by_every_accept(
    pg_url: str,
) -> None:
    """The one-statement accept locks the conversation's row, then the subject's counter
    of messages. The transaction (a key's first message, a refusal told apart) and a
    regenerate take both too: in the other order two of them would deadlock (a burst on a
    new conversation, a regenerate beside a message) and PostgreSQL would abort one.
    With the counter held elsewhere, each waits for it holding the conversation."""
    engine = create_engine(pg_url)
    service = TurnService(
        create_sessionmaker(engine),
        TurnStreams(),
        fair_use=FairUse(LimitSettings(messages_per_minute=100), clock=lambda: FAIR_USE_NOW),
    )
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    plain_url = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    holder, probe = await asyncpg.connect(plain_url), await asyncpg.connect(plain_url)
    try:
        await service.accept(message("m1"))  # the conversation and the counter's row
        service.accepts._places_at_once = False  # the transaction, as for a refusal told apart

        async def regenerate_latest() -> Accepted:
            latest = max(await load_turns(pg_url), key=lambda turn: turn.seq)
            return await service.regenerate(latest.id)

        for attempt in (lambda: service.accept(message("m2")), regenerate_latest):
            await probe.execute("UPDATE turns SET status = 'failed'")  # ended: may be regenerated
            holding = holder.transaction()
            await holding.start()
            await holder.execute(
                "SELECT 1 FROM usage_counters WHERE metric = $1 FOR UPDATE", MESSAGES_PER_MINUTE
            )
            task = asyncio.create_task(attempt())
            async with asyncio.timeout(10):
                while await probe.fetchval(WAITING_FOR_A_LOCK) < 1:  # noqa: ASYNC110 - polled
                    await asyncio.sleep(0.02)
            with pytest.raises(asyncpg.LockNotAvailableError):
                await probe.execute("SELECT 1 FROM conversations FOR UPDATE NOWAIT")
            await holding.rollback()
            assert not (await task).duplicate
        assert len(await load_turns(pg_url)) == 3
    finally:
        await holder.close()
        await probe.close()
        await engine.dispose()


async def test_first_messages_racing_from_two_workers_open_one_conversation_and_lose_none(
    pg_url: str,
) -> None:
    """Two workers each take a key's first message at once: both find no conversation and
    try to create it. The one that loses waits for the winner's commit, creates nothing,
    and takes the next number in the winner's conversation: one conversation, both
    messages stored, numbered 0 and 1. (SQLite has no such race: its write lock is held
    from the number's lookup to the commit.)"""
    engines = [create_engine(pg_url) for _ in range(2)]
    services = [
        TurnService(
            create_sessionmaker(engine),
            TurnStreams(),
            fair_use=FairUse(LimitSettings(messages_per_minute=100), clock=lambda: FAIR_USE_NOW),
        )
        for engine in engines
    ]
    for service in services:
        service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]
    plain_url = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    holder, probe = await asyncpg.connect(plain_url), await asyncpg.connect(plain_url)
    try:
        # The user's counter of messages exists; held, it stops the winner before its commit.
        await services[0].accept(dataclasses.replace(message("m0"), conversation_key="other"))
        holding = holder.transaction()
        await holding.start()
        await holder.execute("SELECT 1 FROM usage_counters FOR UPDATE")
        with recorded_statements(*(engine.sync_engine for engine in engines)) as statements:
            racing = [
                asyncio.create_task(service.accept(message(f"m{n}")))
                for n, service in enumerate(services, start=1)
            ]
            async with asyncio.timeout(10):
                # The winner waits for the counter, the other for the winner's new row.
                while await probe.fetchval(WAITING_FOR_A_LOCK) < 2:  # noqa: ASYNC110 - polled
                    await asyncio.sleep(0.02)
            await holding.rollback()
            accepted = await asyncio.gather(*racing)
        assert not any(each.duplicate or each.rate_limited for each in accepted)
        assert len({each.conversation_id for each in accepted}) == 1
        # Each tried to create it (on PostgreSQL inside the accept's one statement).
        creations = [s for s in statements if "INSERT INTO conversations" in s]
        assert len(creations) >= 2
        turns = [
            t for t in await load_turns(pg_url) if t.conversation_id == accepted[0].conversation_id
        ]
        assert sorted(t.seq for t in turns) == [0, 1]
        assert (await count_rows(pg_url))["conversations"] == 2
    finally:
        await holder.close()
        await probe.close()
        for engine in engines:
            await engine.dispose()


async def test_an_ingress_only_accept_announces_its_turn_in_the_same_statement(
    pg_url: str,
) -> None:
    """An ingress-only process wakes the workers with ``pg_notify``: on the statement that
    stores the turn, so an accept is still one; once per stored turn, at commit, and not
    for a message refused for its persona (rolled back)."""
    engine = create_engine(pg_url)
    service = TurnService(
        create_sessionmaker(engine),
        TurnStreams(),
        fair_use=FairUse(LimitSettings()),
        runs_turns=False,
    )
    service.workers.schedule = lambda conversation_id: None  # type: ignore[method-assign]  # no engine
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(
        make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    await listener.add_listener(wakeups.CHANNEL, lambda *args: heard.put_nowait(args[-1]))

    async def announced() -> list[str]:
        """What the listener heard since last asked, once nothing more comes for 0.2 s."""
        payloads = []
        with contextlib.suppress(TimeoutError):
            while True:
                payloads.append(await asyncio.wait_for(heard.get(), 0.2))
        return payloads

    try:
        first = await service.accept(message("m1"))  # creates the conversation
        assert await announced() == [first.conversation_id]
        with recorded_statements(engine.sync_engine) as statements:
            second = await service.accept(message("m2"))
        assert len(statements) == 1, statements
        assert await announced() == [first.conversation_id]
        conflict = await service.accept(message("m3", persona="pirate"))
        assert conflict.persona_conflict is not None
        again = await service.accept(message("m2"))
        assert again.duplicate and again.turn_id == second.turn_id
        assert await announced() == []
        turns = await load_turns(pg_url)
        assert [(t.seq, t.status) for t in turns] == [
            (0, TurnStatus.QUEUED),
            (1, TurnStatus.QUEUED),
        ]
    finally:
        await listener.close()
        await engine.dispose()


async def test_a_final_write_moves_its_conversations_head_last(
    db_url: str, make_client: MakeClient
) -> None:
    """A final write holds its conversation's row from the head move to its commit, and
    that conversation's next accept (its turn number) waits for the row: nothing else of
    the final write (the fair-use charge, on a row every turn of the key charges) comes
    between the head move and the commit."""
    client = await make_client(db_url)
    key = await issue_key(db_url)
    await answered(client, key, "m0")

    with recorded_statements(*app_sync_engines(client.app)) as log:
        await answered(client, key, "m1")
    finish = next(i for i, s in enumerate(log) if re.search(FINISH, s, re.DOTALL))
    final_write = log[finish:]
    head_move = next(i for i, s in enumerate(final_write) if s.startswith("UPDATE conversations"))
    assert any(s.startswith("INSERT INTO usage_counters") for s in final_write[:head_move])
    # (The worker's claim of a next turn follows: on PostgreSQL an UPDATE finding none.)
    after = [
        s
        for s in final_write[head_move + 1 :]
        if re.match(r"(INSERT|UPDATE|DELETE) ", s) and not re.match(NEXT_CLAIM, s)
    ]
    assert not after, after
