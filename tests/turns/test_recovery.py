"""Start-up after a crash: the turn left running is continued (PostgreSQL) or fails with an
apology (SQLite), and the queue behind it runs.

On SQLite every earlier lease is dead at start (single process); on
PostgreSQL a lease another worker still holds is respected until it runs out.
"""

from __future__ import annotations

import datetime as dt

import pytest

from bot.http.keys import TURNS
from bot.storage.conversations import allocate_turn_seq, open_conversation
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Turn, TurnStatus, utcnow
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, load_turns


async def seed_crashed_conversation(db_url: str, lease_expires_at: dt.datetime) -> list[str]:
    """A conversation as a SIGKILLed worker leaves it: turn 0 running, turn 1 queued."""
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            conversation = await open_conversation(
                session, owner="key:alice", channel="api", external_key="crashed"
            )
            ids = []
            for index, status in enumerate([TurnStatus.RUNNING, TurnStatus.QUEUED]):
                turn = Turn(
                    conversation_id=conversation.id,
                    seq=await allocate_turn_seq(session, conversation.id),
                    channel="api",
                    user_text=f"message {index}",
                    status=status,
                    lease_owner="dead-worker",
                    lease_expires_at=lease_expires_at,
                    started_at=utcnow() if status == TurnStatus.RUNNING else None,
                )
                session.add(turn)
                await session.flush()
                ids.append(turn.id)
        return ids
    finally:
        await engine.dispose()


async def test_a_turn_left_running_is_continued_or_fails_and_the_queue_resumes(
    db_url: str, make_client: MakeClient
) -> None:
    # The lease ran out a minute ago: on either backend its worker is gone.
    running_id, queued_id = await seed_crashed_conversation(
        db_url, utcnow() - dt.timedelta(minutes=1)
    )
    key = await issue_key(db_url, owner="alice")
    client = await make_client(db_url)
    await client.server.app[TURNS].wait_idle(timeout=60)

    turns = {turn.id: turn for turn in await load_turns(db_url)}
    assert turns[queued_id].status == TurnStatus.DONE
    body = await (await client.get(f"/v1/turns/{running_id}", headers=auth(key))).json()
    if db_url.startswith("sqlite"):
        # One process: nothing of the reply was saved while it streamed, nothing to go on from.
        assert turns[running_id].status == TurnStatus.FAILED
        assert turns[running_id].error_class == "internal"
        assert "interrupted" in (turns[running_id].error_message or "")
        assert body["status"] == "failed"
    else:
        # Several workers: the worker that takes the lease continues the turn
        # (docs/replies.md); this one had nothing saved yet, so it is answered afresh.
        assert (turns[running_id].status, turns[running_id].resumes) == (TurnStatus.DONE, 1)
        assert body["status"] == "done"


async def test_postgres_respects_a_lease_another_worker_still_holds(
    make_client: MakeClient, db_url: str
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite is single-process: no other worker can hold a lease")
    running_id, queued_id = await seed_crashed_conversation(
        db_url, utcnow() + dt.timedelta(minutes=5)
    )
    client = await make_client(db_url)
    service = client.server.app[TURNS]
    await service.wait_idle(timeout=30)
    turns = {turn.id: turn for turn in await load_turns(db_url)}
    # The live lease holder keeps its turn; the queued turn waits behind it, in order.
    assert turns[running_id].status == TurnStatus.RUNNING
    assert turns[queued_id].status == TurnStatus.QUEUED
    assert await service.claims.claim_next(turns[running_id].conversation_id) is None
