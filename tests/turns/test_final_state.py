"""Every accepted message ends in exactly one final state, whatever fails on the way.

Faults are injected where they happen in production: a real driver error
raised at a chosen statement of the app's own database engine (one write of a
turn: its start, its final status, its history entries, its charge), U+0000 in a reply
or a message (PostgreSQL refuses it), a table locked by another session for
longer than a write may wait. For each, the promise is checked from outside:
the stream ends with ``done`` or ``error``, the row is final, there is exactly
one ``turn`` log line, and the conversation's next message is answered.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import asyncpg
import pytest
import structlog
from aiohttp.test_utils import TestClient
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from bot.engine.vllm_local import LocalVLLMEngine
from bot.storage.db import create_engine, is_sqlite
from bot.storage.models import TurnStatus, UsageCounter
from bot.turns.limits import TOKEN_METRICS
from tests.conftest import MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.engines import NulByteEngine, SlowEngine, TrickleEngine
from tests.helpers import (
    auth,
    count_rows,
    load_history_rows,
    load_turns,
    read_sse,
    terminate_backends,
    wait_until,
)
from tests.turns.conftest import WriteFaults

# A column set by the statement (before its WHERE), not one it returns.
START = r"^UPDATE turns SET (?:(?! WHERE ).)*\bstarted_at="
FINAL = r"^UPDATE turns SET (?:(?! WHERE ).)*\bfinished_at="
HISTORY = r"^INSERT INTO messages"
# Fair use's charge of a turn's tokens, in its final write: the counter's upsert with no
# limit (the accept's take of a message has one, in its WHERE).
CHARGE = r"^INSERT INTO usage_counters (?:(?! WHERE ).)*RETURNING"
# The statement that stores a turn. On PostgreSQL the turn's INSERT is a CTE of its
# inbound event's, and, in a conversation that exists, itself selects from the turn
# number's UPDATE (one round trip).
ACCEPT = (
    r"^(?:INSERT INTO turns|WITH new_turn AS\s*\(INSERT INTO turns"
    r"|WITH slot AS\s*\(UPDATE conversations)"
)
# Fair use's statement: the standing alone (SQLite), or the standing and the take
# (PostgreSQL), on its own or (PostgreSQL, the one statement) as CTEs of the accept's.
FAIR_USE = (
    r"^(?:WITH standing AS\s*\()?SELECT \(SELECT limit_overrides"
    r"|WITH slot AS.*limit_overrides"
)
READ_HISTORY = r"^SELECT conversations\.head_seq, \(SELECT max"
"""A queued turn's history read: its conversation's head (with the path known from the
previous turn's final write, the one statement it sends). A turn its accept stores
running (SQLite, an idle conversation) has the head from the accept's statement."""


def turn_lines(logs: list[dict[str, Any]], turn_id: str) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == "turn" and e.get("turn_id") == turn_id]


async def send(client: TestClient[Any, Any], key: str, message_id: str, text: str) -> Any:
    body = {"conversation_id": "c1", "message_id": message_id, "text": text}
    response = await client.post("/v1/messages", json=body, headers=auth(key))
    assert response.status == 202, await response.text()
    return await response.json()


async def final_event(client: TestClient[Any, Any], key: str, turn_id: str) -> Any:
    async with asyncio.timeout(60):
        events = await read_sse(await client.get(f"/v1/turns/{turn_id}/events", headers=auth(key)))
    assert events[-1].kind in ("done", "error")
    return events[-1]


async def test_nul_in_a_message_and_in_its_reply_is_stored_and_the_chat_goes_on(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    client = await make_client(db_url, engine_override=NulByteEngine(engine))
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        first = await send(client, key, "m1", "a\u0000b")
        done = await final_event(client, key, first["turn_id"])
        second = await send(client, key, "m2", "and then?")
        assert (await final_event(client, key, second["turn_id"])).kind == "done"

    assert done.kind == "done", done.data
    assert "\x00" not in done.data["text"] and "\ufffd" in done.data["text"]
    turns = await load_turns(db_url)
    assert [t.status for t in turns] == [TurnStatus.DONE, TurnStatus.DONE]
    assert turns[0].user_text == "a\ufffdb"
    assert turns[0].reply_text == done.data["text"]
    # The replayed final event (from the row) equals the live one.
    replayed = await final_event(client, key, first["turn_id"])
    assert replayed.data == done.data
    history = await load_history_rows(db_url)
    assert [m.role for m in history][-4:] == ["user", "assistant", "user", "assistant"]
    assert all("\x00" not in m.text for m in history)
    assert len(turn_lines(logs, first["turn_id"])) == 1


@pytest.mark.parametrize("write", [START, FINAL, HISTORY], ids=["start", "final", "history"])
async def test_a_write_that_fails_twice_is_retried_and_the_turn_answered(
    db_url: str,
    make_client: MakeClient,
    faults: list[WriteFaults],
    engine: LocalVLLMEngine,
    write: str,
) -> None:
    # The second message arrives while the first is generating, so it waits queued and
    # has a start of its own (on SQLite the first, to an idle conversation, began in its
    # accept).
    client = await make_client(db_url, engine_override=SlowEngine(engine, 0.05))
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    with structlog.testing.capture_logs() as logs:
        fault.fail(write, times=2)
        first = await send(client, key, "m1", "Hello")
        second = await send(client, key, "m2", "Again")
        assert (await final_event(client, key, first["turn_id"])).kind == "done"
        assert (await final_event(client, key, second["turn_id"])).kind == "done"
    assert fault.raised == 2
    assert [t.status for t in await load_turns(db_url)] == [TurnStatus.DONE] * 2
    roles = [m.role for m in await load_history_rows(db_url)]
    assert roles == ["user", "assistant", "user", "assistant"]
    for accepted in (first, second):
        assert len(turn_lines(logs, accepted["turn_id"])) == 1


async def test_a_charge_that_fails_twice_is_retried_with_its_turn_and_counted_once(
    db_url: str, make_client: MakeClient, faults: list[WriteFaults]
) -> None:
    # The charge shares the final write's transaction: a failed one rolls the turn's
    # final status back with it, and the retry writes both, once.
    client = await make_client(db_url)
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    fault.fail(CHARGE, times=2)
    first = await send(client, key, "m1", "Hello")
    assert (await final_event(client, key, first["turn_id"])).kind == "done"
    assert fault.raised == 2
    (turn,) = await load_turns(db_url)
    assert turn.status == TurnStatus.DONE
    computed = (turn.prompt_tokens or 0) - (turn.cached_tokens or 0) + (turn.completion_tokens or 0)
    assert computed > 0
    engine = create_engine(db_url)
    try:
        async with engine.connect() as connection:
            charged = await connection.scalar(
                select(func.sum(UsageCounter.value)).where(UsageCounter.metric.in_(TOKEN_METRICS))
            )
    finally:
        await engine.dispose()
    assert charged == computed


async def test_history_refused_for_good_fails_the_turn_visibly_and_the_chat_goes_on(
    db_url: str, make_client: MakeClient, faults: list[WriteFaults]
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    with structlog.testing.capture_logs() as logs:
        fault.fail(HISTORY)
        first = await send(client, key, "m1", "Hello")
        ended = await final_event(client, key, first["turn_id"])
        fault.clear()
        second = await send(client, key, "m2", "Again")
        assert (await final_event(client, key, second["turn_id"])).kind == "done"

    assert ended.kind == "error" and ended.data["error_class"] == "internal"
    turns = await load_turns(db_url)
    assert [t.status for t in turns] == [TurnStatus.FAILED, TurnStatus.DONE]
    assert turns[0].error_class == "internal"
    assert "final write failed" in (turns[0].error_message or "")
    lines = turn_lines(logs, first["turn_id"])
    assert len(lines) == 1 and lines[0]["status"] == "failed"
    # The failed turn added nothing to the history; the next one continued it.
    assert [m.role for m in await load_history_rows(db_url)] == ["user", "assistant"]


async def test_a_history_read_that_fails_fails_its_turn_once_and_the_chat_goes_on(
    db_url: str, make_client: MakeClient, faults: list[WriteFaults], engine: LocalVLLMEngine
) -> None:
    """A read, not a write, but the turn needs it: the turn ends once, failed, and the
    next turn reads the history (known paths or not) and answers. The failing turn's
    message comes while the one before is answered: it waits queued, and its run reads
    the conversation's head."""
    slow = SlowEngine(engine, 0.0)
    recorded = RecordingEngine(slow)
    client = await make_client(db_url, engine_override=recorded)
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    with structlog.testing.capture_logs() as logs:
        first = await send(client, key, "m1", "Hello")
        assert (await final_event(client, key, first["turn_id"])).kind == "done"
        slow.pause_s = 0.05
        second = await send(client, key, "m2", "Go on")
        # Its history read is behind it once it is generating: only the next one's fails.
        await wait_until(lambda: len(recorded.calls) == 2, timeout_s=30)
        fault.fail(READ_HISTORY, times=1)
        third = await send(client, key, "m3", "And then?")
        assert (await final_event(client, key, second["turn_id"])).kind == "done"
        ended = await final_event(client, key, third["turn_id"])
        slow.pause_s = 0.0
        fourth = await send(client, key, "m4", "Again")
        assert (await final_event(client, key, fourth["turn_id"])).kind == "done"

    assert fault.raised == 1
    assert ended.kind == "error" and ended.data["error_class"] == "internal"
    turns = await load_turns(db_url)
    assert [t.status for t in turns] == [
        TurnStatus.DONE,
        TurnStatus.DONE,
        TurnStatus.FAILED,
        TurnStatus.DONE,
    ]
    for accepted in (first, second, third, fourth):
        assert len(turn_lines(logs, accepted["turn_id"])) == 1
    # The fourth turn's prompt is the first two exchanges and its own: nothing of the third.
    roles = [m.role for m in await load_history_rows(db_url)]
    assert roles == ["user", "assistant"] * 3


async def test_a_turn_nothing_can_be_written_for_is_failed_and_the_next_one_answered(
    db_url: str, make_client: MakeClient, faults: list[WriteFaults]
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    with structlog.testing.capture_logs() as logs:
        fault.fail(FINAL)
        first = await send(client, key, "m1", "Hello")
        ended = await final_event(client, key, first["turn_id"])
        # The database answers again: the next message finds the dead turn, fails its
        # row and is answered.
        fault.clear()
        second = await send(client, key, "m2", "Again")
        assert (await final_event(client, key, second["turn_id"])).kind == "done"

    assert ended.kind == "error" and ended.data["error_class"] == "internal"
    assert [t.status for t in await load_turns(db_url)] == [TurnStatus.FAILED, TurnStatus.DONE]
    lines = turn_lines(logs, first["turn_id"])
    assert len(lines) == 1 and lines[0]["recorded"] is False


async def test_a_turn_left_running_is_failed_within_the_bound_when_no_message_follows(
    db_url: str, make_client: MakeClient, faults: list[WriteFaults]
) -> None:
    client = await make_client(db_url, workers={"watchdog_grace_s": 0.5, "poll_interval_s": 0.2})
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    with structlog.testing.capture_logs() as logs:
        fault.fail(FINAL)
        first = await send(client, key, "m1", "Hello")
        assert (await final_event(client, key, first["turn_id"])).kind == "error"
        assert [t.status for t in await load_turns(db_url)] == [TurnStatus.RUNNING]
        fault.clear()
        for _ in range(100):
            if (await load_turns(db_url))[0].status == TurnStatus.FAILED:
                break
            await asyncio.sleep(0.1)

    # SQLite: the poller's next claim of the conversation fails it; PostgreSQL: the
    # watchdog (the poller leaves a turn running under this worker's own lease alone).
    assert "no live generation" in ((await load_turns(db_url))[0].error_message or "")
    assert len(turn_lines(logs, first["turn_id"])) == 1


# A key's first message creates its conversation: on its own (``conversations.create_conversation``,
# SQLite) or inside the accept's one statement (PostgreSQL).
NEW_CONVERSATION = r"^(?:WITH slot AS.*)?INSERT INTO conversations"


@pytest.mark.parametrize(
    "failing", [ACCEPT, FAIR_USE, NEW_CONVERSATION], ids=["turn", "fair_use", "conversation"]
)
async def test_a_refused_accept_is_a_503_that_stores_nothing_and_can_be_retried(
    db_url: str, make_client: MakeClient, faults: list[WriteFaults], failing: str
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    fault = WriteFaults(client)
    faults.append(fault)
    fault.fail(failing, times=1)
    body = {"conversation_id": "c1", "message_id": "m1", "text": "Hello"}
    refused = await client.post("/v1/messages", json=body, headers=auth(key))
    assert refused.status == 503
    assert (await refused.json())["error"] == "unavailable"
    assert "Retry-After" in refused.headers
    assert fault.raised == 1
    assert (await count_rows(db_url))["turns"] == 0
    accepted = await send(client, key, "m1", "Hello")
    assert (await final_event(client, key, accepted["turn_id"])).kind == "done"


async def test_a_table_locked_longer_than_a_write_may_wait_delays_the_reply_only(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    # The reply trickles for seconds whatever vLLM merges into one step: the lock is
    # taken while it is still generating, so its final write meets the lock.
    slow = TrickleEngine(engine, piece_chars=4, pause_s=0.0)
    client = await make_client(db_url, engine_override=slow)
    key = await issue_key(db_url)
    with structlog.testing.capture_logs() as logs:
        slow.pause_s = 0.05
        first = await send(client, key, "m1", "Hello")
        await asyncio.sleep(0.3)
        await hold_lock(db_url, hold_s=7.0)
        assert (await final_event(client, key, first["turn_id"])).kind == "done"
        slow.pause_s = 0.0
        second = await send(client, key, "m2", "Again")
        assert (await final_event(client, key, second["turn_id"])).kind == "done"
    assert any(e.get("event") == "turn_final_write_retry" for e in logs)
    assert [t.status for t in await load_turns(db_url)] == [TurnStatus.DONE] * 2


async def hold_lock(db_url: str, hold_s: float) -> None:
    """Another session holds the turns table (PostgreSQL) or the database (SQLite)."""
    url = make_url(db_url)
    if is_sqlite(db_url):
        await asyncio.to_thread(_hold_sqlite, url.database or "", hold_s)
        return
    connection = await asyncpg.connect(
        url.set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        async with connection.transaction():
            await connection.execute("LOCK TABLE turns IN ACCESS EXCLUSIVE MODE")
            await asyncio.sleep(hold_s)  # longer than one write attempt may wait
    finally:
        await connection.close()


def _hold_sqlite(path: str, hold_s: float) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("BEGIN EXCLUSIVE")
        time.sleep(hold_s)  # longer than the app's busy_timeout
        connection.execute("ROLLBACK")
    finally:
        connection.close()


@pytest.mark.postgres
async def test_every_connection_dropped_mid_turn_delays_nothing_it_cannot_retry(
    pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    """As a PostgreSQL restart looks to the app: every connection it holds is cut."""
    slow = SlowEngine(engine, 0.1)
    client = await make_client(pg_url, engine_override=slow)
    key = await issue_key(pg_url)
    first = await send(client, key, "m1", "Hello")
    reader = asyncio.create_task(final_event(client, key, first["turn_id"]))
    await asyncio.sleep(0.5)
    assert await terminate_backends(pg_url, "true") >= 1
    assert (await reader).kind == "done"
    slow.pause_s = 0.0
    second = await send(client, key, "m2", "Again")
    assert (await final_event(client, key, second["turn_id"])).kind == "done"
    assert [t.status for t in await load_turns(pg_url)] == [TurnStatus.DONE] * 2
