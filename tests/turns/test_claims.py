"""Two workers on one real PostgreSQL: who takes a new turn, and who stops a running one."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from typing import Any

import asyncpg
import pytest
import structlog
import structlog.testing
from sqlalchemy import event, make_url, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.channels.base import ReplySink, TurnAddress
from bot.engine.vllm_local import LocalVLLMEngine
from bot.storage.conversations import allocate_turn_seq, open_conversation
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Turn, TurnStatus, utcnow
from bot.turns import claims as claims_module
from bot.turns.ending import TurnEndings
from bot.turns.leases import FRESH_TURN_GRACE, LeasedClaims, database_now
from bot.turns.partials import PartialReplies, ReplySnapshot
from bot.turns.streams import TurnStreams
from tests.conftest import MakeClient, issue_key
from tests.engines import TrickleEngine
from tests.helpers import auth, plain_executes, read_sse, recorded_statements


def _no_channel(address: TurnAddress) -> ReplySink:
    raise LookupError(f"no channel for {address.channel}")


async def add_turn(session: AsyncSession, conversation_key: str, **fields: Any) -> Turn:
    """A turn of Alice's API conversation ``conversation_key``, added in ``session``."""
    conversation = await open_conversation(
        session, owner="alice", channel="api", external_key=conversation_key
    )
    turn = Turn(
        conversation_id=conversation.id,
        seq=await allocate_turn_seq(session, conversation.id),
        channel="api",
        user_text="hello",
        **fields,
    )
    session.add(turn)
    await session.flush()
    return turn


async def test_other_workers_leave_a_fresh_turn_to_the_worker_that_accepted_it(
    pg_url: str,
) -> None:
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    other = LeasedClaims(sessions, worker_id="other")
    try:
        async with sessions() as session, session.begin():
            turn = await add_turn(session, "fresh", status=TurnStatus.QUEUED)
        # Just accepted: the accepting worker is claiming it; another poller looks away.
        assert await other.claimable_conversations() == []

        # Still unclaimed after the grace (its worker died before claiming): anyone takes it.
        async with sessions() as session, session.begin():
            await session.execute(
                update(Turn)
                .where(Turn.id == turn.id)
                .values(created_at=utcnow() - FRESH_TURN_GRACE - dt.timedelta(seconds=1))
            )
        assert await other.claimable_conversations() == [turn.conversation_id]
        claimed = await other.claim_next(turn.conversation_id)
        assert claimed is not None and claimed.id == turn.id
        assert claimed.lease_owner == "other"
    finally:
        await engine.dispose()


async def test_a_turn_running_on_one_worker_is_stopped_from_another(
    pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    workers = {"poll_interval_s": 0.1}
    # A reply that keeps growing for seconds whatever vLLM merges (SlowEngine's pause is
    # per step: a loaded machine merged 600 tokens into a few steps, ended in 1 s, and the
    # stop came too late).
    runs_it = await make_client(
        pg_url,
        engine_override=TrickleEngine(engine, 4, 0.05),
        generation={"max_tokens": 600},
        workers=workers,
    )
    other = await make_client(pg_url, workers=workers)
    key = await issue_key(pg_url)
    message = {"conversation_id": "c1", "message_id": "m1", "text": "Say a lot"}
    body = await (await runs_it.post("/v1/messages", json=message, headers=auth(key))).json()
    stream = await runs_it.get(body["stream_url"], headers=auth(key))
    await stream.content.readline()  # the first delta: the turn runs on the first worker

    cancel = await other.post(f"/v1/turns/{body['turn_id']}/cancel", headers=auth(key))
    assert (await cancel.json())["cancelled"] is True
    events = await read_sse(stream)
    assert events[-1].kind == "error"
    assert events[-1].data["error_class"] == "cancelled"
    turn = await (await other.get(f"/v1/turns/{body['turn_id']}", headers=auth(key))).json()
    assert turn["status"] == "stopped" and turn["error_class"] == "cancelled"
    assert turn["usage"]["completion_tokens"] < 600
    # Finished: asking again changes nothing.
    again = await other.post(f"/v1/turns/{body['turn_id']}/cancel", headers=auth(key))
    assert (await again.json())["cancelled"] is False


async def test_leases_are_judged_on_the_database_clock_not_a_skewed_host_clock(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    try:
        async with sessions() as session, session.begin():
            db_now = await database_now(session)
            turn = await add_turn(
                session,
                "skew",
                status=TurnStatus.RUNNING,
                lease_owner="healthy-worker",
                lease_expires_at=db_now + dt.timedelta(seconds=20),
            )
        # This host's clock runs an hour ahead: by it, the healthy worker's lease is long gone.
        monkeypatch.setattr(claims_module, "utcnow", lambda: db_now + dt.timedelta(hours=1))
        skewed = LeasedClaims(sessions, worker_id="skewed", lease_s=30)
        assert await skewed.claimable_conversations() == []
        assert await skewed.claim_next(turn.conversation_id) is None

        # Its renewals are on the database's clock too: 30 s from the database's now.
        # (Only a turn whose generation lives in this process keeps its lease.)
        skewed.bind(_no_channel, TurnEndings(sessions, TurnStreams()), lambda: {turn.id})
        async with sessions() as session, session.begin():
            await session.execute(
                update(Turn).where(Turn.id == turn.id).values(lease_owner="skewed")
            )
        assert await skewed.renew() == 1
        async with sessions() as session:
            renewed = await session.get(Turn, turn.id)
            assert renewed is not None and renewed.lease_expires_at is not None
            expires_in = renewed.lease_expires_at - await database_now(session)
        assert dt.timedelta(seconds=25) < expires_in <= dt.timedelta(seconds=30)
    finally:
        await engine.dispose()


async def test_a_free_queued_head_is_claimed_in_one_statement_and_a_live_lease_is_respected(
    pg_url: str,
) -> None:
    """The common claim (the head queued, its lease free or run out) is one statement; a
    head another worker holds a live lease on, or is deciding on (its row locked), is
    not taken, and the turn behind a head is never claimed before it."""
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    claims = LeasedClaims(sessions, worker_id="me", lease_s=30)
    try:
        async with sessions() as session, session.begin():
            db_now = await database_now(session)
            head = await add_turn(
                session,
                "leased",
                lease_owner="other",
                lease_expires_at=db_now + dt.timedelta(seconds=20),
            )
            behind = await add_turn(session, "leased")
        assert await claims.claim_next(head.conversation_id) is None
        async with sessions() as session:
            kept = await session.get(Turn, head.id)
            assert kept is not None and kept.lease_owner == "other"

        async with sessions() as session, session.begin():
            await session.execute(
                update(Turn)
                .where(Turn.id == head.id)
                .values(lease_expires_at=db_now - dt.timedelta(seconds=1))
            )
        with recorded_statements(engine.sync_engine) as statements:
            claimed = await claims.claim_next(head.conversation_id)
        assert claimed is not None and claimed.id == head.id != behind.id
        assert len(statements) == 1, statements
        async with sessions() as session:
            mine = await session.get(Turn, head.id)
            assert mine is not None and mine.lease_owner == "me"
            assert mine.status == TurnStatus.QUEUED and mine.lease_expires_at is not None
            expires_in = mine.lease_expires_at - await database_now(session)
        assert dt.timedelta(seconds=25) < expires_in <= dt.timedelta(seconds=30)

        # Another worker deciding on the head holds its row: skipped at once, not waited for.
        async with sessions() as session, session.begin():
            await session.execute(update(Turn).where(Turn.id == head.id).values(lease_owner=None))
            async with asyncio.timeout(5):
                assert await claims.claim_next(head.conversation_id) is None
    finally:
        await engine.dispose()


async def test_a_reader_on_another_worker_sees_the_reply_grow(
    pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    # A few seconds of reply: one character every 0.05 s (the demo model's 64 tokens make
    # some 50 characters), against a save of the reply so far every 0.5 s.
    runs_it = await make_client(
        pg_url, engine_override=TrickleEngine(engine, 1, 0.05), generation={"max_tokens": 64}
    )
    other = await make_client(pg_url)
    key = await issue_key(pg_url)
    message = {"conversation_id": "c1", "message_id": "m1", "text": "Tell me more"}
    body = await (await runs_it.post("/v1/messages", json=message, headers=auth(key))).json()
    # Read from the worker that does not run the turn (a reconnect sent elsewhere).
    stream = await other.get(f"/v1/turns/{body['turn_id']}/events", headers=auth(key))
    events = await read_sse(stream)

    assert events[-1].kind == "done"
    deltas = [event.data["text"] for event in events if event.kind == "delta"]
    assert len(deltas) >= 2, "the reply arrived in one piece"
    assert "".join(deltas) == events[-1].data["text"]


async def test_the_reply_so_far_is_saved_only_under_the_turns_lease(pg_url: str) -> None:
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    try:
        async with sessions() as session, session.begin():
            turn = await add_turn(session, "partial", status=TurnStatus.RUNNING, lease_owner="w1")
        # One statement, outside a transaction (no BEGIN, no COMMIT: two round trips fewer).
        with plain_executes() as plain, recorded_statements(engine.sync_engine) as statements:
            assert await PartialReplies(sessions, "w1").save(turn.id, ReplySnapshot("Hel")) is True
        assert (len(statements), plain) == (1, []), (statements, plain)
        # Another worker (this one's lease ran out and it took over) is not overwritten.
        assert (
            await PartialReplies(sessions, "w2").save(turn.id, ReplySnapshot("Hello from w2"))
            is False
        )
        async with sessions() as session, session.begin():
            await session.execute(
                update(Turn).where(Turn.id == turn.id).values(status=TurnStatus.FAILED)
            )
        assert await PartialReplies(sessions, "w1").save(turn.id, ReplySnapshot("Hello")) is False
        async with sessions() as session:
            stored = await session.get(Turn, turn.id)
            assert stored is not None and stored.reply_text == "Hel"
    finally:
        await engine.dispose()


SAVE_WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    " AND query LIKE '%UPDATE turns SET reply_text%'"
)


async def test_a_save_in_flight_when_the_turn_ends_is_let_finish_not_cancelled(
    pg_url: str,
) -> None:
    """Under load a save of the replies so far is often in flight as a generation ends.
    Cancelled there, the statement would cost a cancel request to the server and the
    pooled connection (invalidated): the turn's end leaves it to finish instead."""
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    invalidated: list[object] = []
    event.listen(engine.sync_engine.pool, "invalidate", lambda *args: invalidated.append(args))
    plain_url = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    # One holds the lock; the other asks who waits (a transaction sees one snapshot of that).
    holder, watcher = await asyncpg.connect(plain_url), await asyncpg.connect(plain_url)
    try:
        async with sessions() as session, session.begin():
            turn = await add_turn(session, "slow", status=TurnStatus.RUNNING, lease_owner="w1")
        # Another session holds the table against writes (a save skips held rows, but a
        # table it must wait for): the first save waits.
        holding = holder.transaction()
        await holding.start()
        await holder.execute("LOCK TABLE turns IN SHARE MODE")
        partials = PartialReplies(sessions, "w1", interval_s=0.05)
        async with partials.saving(turn.id, lambda: ReplySnapshot("Hel")):
            async with asyncio.timeout(10):
                while not await watcher.fetchval(SAVE_WAITING):  # noqa: ASYNC110 - polled: no event
                    await asyncio.sleep(0.02)
        # The generation has ended while its save still waits; the lock goes.
        await holding.rollback()
        async with asyncio.timeout(10):
            while True:
                async with sessions() as session:
                    stored = await session.get(Turn, turn.id)
                    assert stored is not None
                    if stored.reply_text == "Hel":
                        break
                await asyncio.sleep(0.02)
        assert invalidated == []
        await partials.close()
    finally:
        await holder.close()
        await watcher.close()
        await engine.dispose()


async def test_a_workers_running_turns_are_saved_together_and_a_held_row_is_not_waited_for(
    pg_url: str,
) -> None:
    """Hundreds of turns generating at once (a slow model under load) saved their replies
    so far one statement each, more than half of a worker's round trips to the database,
    and with pooled connections the accepts waited for. A worker saves all its running
    turns' replies in one statement an interval. It skips rows another session holds (a
    final write, a cancel) instead of waiting for them with the others' locked: those
    turns are saved at a later interval, and are not taken for lost."""
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    plain_url = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    holder, watcher = await asyncpg.connect(plain_url), await asyncpg.connect(plain_url)
    try:
        async with sessions() as session, session.begin():
            turns = [
                await add_turn(session, f"busy{i}", status=TurnStatus.RUNNING, lease_owner="w1")
                for i in range(6)
            ]
        ids = [turn.id for turn in turns]
        held, free = ids[:3], ids[3:]
        # Another session holds half the turns' rows.
        holding = holder.transaction()
        await holding.start()
        await holder.execute("SELECT 1 FROM turns WHERE id = ANY($1::text[]) FOR UPDATE", held)
        partials = PartialReplies(sessions, "w1", interval_s=0.05)
        lost: list[str] = []

        async def stored() -> dict[str, str | None]:
            async with sessions() as session:
                rows = await session.execute(select(Turn.id, Turn.reply_text))
                return {turn_id: reply for turn_id, reply in rows if turn_id in ids}

        with recorded_statements(engine.sync_engine) as statements:
            async with contextlib.AsyncExitStack() as generating:
                for turn_id in ids:
                    await generating.enter_async_context(
                        partials.saving(
                            turn_id,
                            lambda turn_id=turn_id: ReplySnapshot(f"so far {turn_id}"),
                            on_lost=lambda turn_id=turn_id: lost.append(turn_id),
                        )
                    )
                # Ten intervals: the free turns saved, the held ones skipped, no save waiting.
                await asyncio.sleep(0.5)
                assert await watcher.fetchval(SAVE_WAITING) == 0
                now = await stored()
                assert {i: now[i] for i in free} == {i: f"so far {i}" for i in free}
                assert {i: now[i] for i in held} == dict.fromkeys(held)
                saves_while_held = sum("SET reply_text" in s for s in statements)
                await holding.rollback()
                async with asyncio.timeout(10):
                    while await stored() != {i: f"so far {i}" for i in ids}:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
        # One statement an interval for all the turns (about ten while held), not one a turn.
        assert 1 <= saves_while_held <= 12, saves_while_held
        assert lost == []
        await partials.close()
    finally:
        await holder.close()
        await watcher.close()
        await engine.dispose()


async def test_a_turn_no_longer_ours_among_the_saved_is_told_once_and_the_rest_saved(
    pg_url: str,
) -> None:
    """One statement saves every running turn's reply: a turn another worker took over
    (its lease) is not written, its own generation is told once (it stops), and the
    others' replies are stored and go on being saved."""
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    try:
        async with sessions() as session, session.begin():
            ours = await add_turn(session, "ours", status=TurnStatus.RUNNING, lease_owner="w1")
            taken = await add_turn(session, "taken", status=TurnStatus.RUNNING, lease_owner="w2")
        partials = PartialReplies(sessions, "w1", interval_s=0.05)
        lost: list[str] = []
        reply = "Hel"
        async with (
            partials.saving(
                ours.id, lambda: ReplySnapshot(reply), on_lost=lambda: lost.append("ours")
            ),
            partials.saving(
                taken.id, lambda: ReplySnapshot(reply + "!"), on_lost=lambda: lost.append("taken")
            ),
        ):
            await asyncio.sleep(0.3)
            reply = "Hello"
            await asyncio.sleep(0.3)
        async with sessions() as session:
            stored = {t.id: t.reply_text for t in await session.scalars(select(Turn))}
        assert stored == {ours.id: "Hello", taken.id: None}
        assert lost == ["taken"]
        await partials.close()
    finally:
        await engine.dispose()


async def test_a_failed_save_is_tried_again_at_the_next_interval(pg_url: str) -> None:
    """A save the database refuses costs readers elsewhere one step, not the saves after
    it: the next interval tries again. The saver's lines are the worker's: they do not
    carry the log fields of the turn whose generation happened to start the saver."""
    # The server answers, but refuses this database: every save fails at connect.
    refused = create_engine(make_url(pg_url).set(database="no_such_database").render_as_string())
    partials = PartialReplies(create_sessionmaker(refused), "w1", interval_s=0.05)
    try:
        merged = [structlog.contextvars.merge_contextvars]
        with (
            structlog.testing.capture_logs(processors=merged) as logs,
            structlog.contextvars.bound_contextvars(turn_id="t-refused", conversation_id="c"),
        ):
            async with partials.saving("t-refused", lambda: ReplySnapshot("Hel")):
                await asyncio.sleep(0.5)
        failures = [line for line in logs if line["event"] == "partial_reply_not_saved"]
        assert len(failures) >= 3
        assert not [line for line in failures if "turn_id" in line or "conversation_id" in line]
        await partials.close()
    finally:
        await refused.dispose()


async def test_a_worker_whose_turn_was_taken_over_stops_generating_it(
    pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    # A reply that takes half a minute or more: one character every 0.2 s.
    client = await make_client(
        pg_url, engine_override=TrickleEngine(engine, 1, 0.2), generation={"max_tokens": 600}
    )
    key = await issue_key(pg_url)
    message = {"conversation_id": "c1", "message_id": "m1", "text": "Tell me more"}
    body = await (await client.post("/v1/messages", json=message, headers=auth(key))).json()
    stream = await client.get(f"/v1/turns/{body['turn_id']}/events", headers=auth(key))
    await asyncio.sleep(1.0)
    # Another worker decides this one is dead (its lease ran out) and fails the turn.
    other = create_engine(pg_url)
    try:
        async with create_sessionmaker(other)() as session, session.begin():
            await session.execute(
                update(Turn)
                .where(Turn.id == body["turn_id"])
                .values(status=TurnStatus.FAILED, error_class="internal", lease_owner=None)
            )
    finally:
        await other.dispose()
    taken_over = time.monotonic()
    events = await read_sse(stream)
    # The generation stopped at its next save of the reply so far (every 0.5 s), and
    # the stream ended with the ending the other worker stored.
    assert time.monotonic() - taken_over < 5.0
    assert events[-1].kind == "error" and events[-1].data["error_class"] == "internal"


@pytest.mark.parametrize("loop_name", ["_poll_once", "renew"])
async def test_stopping_the_claims_ends_loops_whose_cancellation_came_out_as_another_error(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, loop_name: str
) -> None:
    # SQLAlchemy once turned a poll's CancelledError into PendingRollbackError on its way
    # out (an invalidated SQLite connection); the poller took it for a database blink and
    # polled on, and the shutdown that had cancelled it waited for ever.
    async def interrupted(*_: Any) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("the library's own error on the way out") from None

    monkeypatch.setattr(LeasedClaims, loop_name, interrupted)
    engine = create_engine(pg_url)
    claims = LeasedClaims(
        create_sessionmaker(engine), worker_id="stopping", lease_s=0.3, poll_interval_s=0.01
    )
    try:
        claims.start(lambda _conversation_id: None, lambda _turn_id: False)
        await asyncio.sleep(0.3)  # both loops are inside their interrupted call
        closing = asyncio.ensure_future(claims.close())
        await asyncio.wait({closing}, timeout=5)
        assert closing.done(), "a loop went on after it was stopped"
    finally:
        # Had a loop gone on, it now sleeps between rounds, where a cancel stops it.
        for task in claims._tasks:
            task.cancel()
        await engine.dispose()


@pytest.mark.parametrize("started", [True, False], ids=["worker", "never_started"])
async def test_closing_hands_back_the_queued_turns_claimed_here_only_if_it_claimed(
    pg_url: str, started: bool
) -> None:
    """A worker's stop frees the queued turns it claimed but did not start, for the others
    to take at once; claims never started (an ingress-only process, perhaps given the same
    ``workers.id`` in a shared bot.toml) claimed nothing and leave such a lease be."""
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    claims = LeasedClaims(sessions, worker_id="w1", lease_s=30, poll_interval_s=30)
    try:
        async with sessions() as session, session.begin():
            turn = await add_turn(
                session,
                "c1",
                lease_owner="w1",
                lease_expires_at=await database_now(session) + dt.timedelta(seconds=30),
            )
        if started:
            claims.start(lambda _conversation_id: None, lambda _turn_id: False)
        await claims.close()
        async with sessions() as session:
            row = await session.get_one(Turn, turn.id)
        assert row.status == TurnStatus.QUEUED
        assert row.lease_owner == (None if started else "w1")
    finally:
        await engine.dispose()
