"""SQLite under concurrent read-then-write transactions: they queue, none fails as 'locked'."""

from __future__ import annotations

import asyncio

from sqlalchemy import select, update

from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation


async def test_read_then_write_transactions_queue_instead_of_failing(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    sessions = create_sessionmaker(engine)
    async with sessions() as session, session.begin():
        session.add(Conversation(id="c", owner="o", channel="api", external_key="k"))

    async def bump() -> None:
        # Read, yield to the others (so they commit in between), then write.
        async with sessions() as session, session.begin():
            seq = await session.scalar(
                select(Conversation.next_turn_seq).where(Conversation.id == "c")
            )
            await asyncio.sleep(0.01)
            await session.execute(
                update(Conversation)
                .where(Conversation.id == "c")
                .values(next_turn_seq=(seq or 0) + 1)
            )

    try:
        await asyncio.gather(*(bump() for _ in range(20)))
        async with sessions() as session:
            final = await session.scalar(select(Conversation.next_turn_seq))
    finally:
        await engine.dispose()
    # Serialised: no lost update and no "database is locked".
    assert final == 20
