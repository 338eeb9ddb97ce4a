"""Which worker's poller may take a queued turn, on a real PostgreSQL shared by two workers."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import update

from bot.storage import queries
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Turn, TurnStatus, utcnow
from bot.turns.claims import FRESH_TURN_GRACE, TurnClaims
from tests.conftest import migrated_postgres_database


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async with migrated_postgres_database() as url:
        yield url


async def test_other_workers_leave_a_fresh_turn_to_the_worker_that_accepted_it(
    pg_url: str,
) -> None:
    engine = create_engine(pg_url)
    sessions = create_sessionmaker(engine)
    other = TurnClaims(sessions, worker_id="other", exclusive=False)
    try:
        async with sessions() as session, session.begin():
            conversation = await queries.open_conversation(
                session, owner="alice", channel="api", external_key="fresh"
            )
            turn = Turn(
                conversation_id=conversation.id,
                seq=await queries.allocate_turn_seq(session, conversation.id),
                channel="api",
                user_text="hello",
                status=TurnStatus.QUEUED,
            )
            session.add(turn)
        # Just accepted: the accepting worker is claiming it; another poller looks away.
        assert await other.claimable_conversations() == []

        # Still unclaimed after the grace (its worker died before claiming): anyone takes it.
        async with sessions() as session, session.begin():
            await session.execute(
                update(Turn)
                .where(Turn.id == turn.id)
                .values(created_at=utcnow() - FRESH_TURN_GRACE - dt.timedelta(seconds=1))
            )
        assert await other.claimable_conversations() == [conversation.id]
        claimed = await other.claim_next(conversation.id)
        assert claimed is not None and claimed.id == turn.id
        assert claimed.lease_owner == "other"
    finally:
        await engine.dispose()
