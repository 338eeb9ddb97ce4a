"""The migration that moves API keys' conversations into the ``key:`` namespace.

A key made before it still reaches its conversations after it, and a platform
tenant named like a key owner is left where it was.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from bot.storage.db import create_engine
from bot.storage.migrate import downgrade, upgrade

BEFORE = "0011"
AFTER = "0012"


async def _rows(url: str, sql: str) -> list[tuple[str, ...]]:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            return [tuple(row) for row in (await connection.execute(text(sql))).all()]
    finally:
        await engine.dispose()


async def _run(url: str, *statements: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            for statement in statements:
                await connection.execute(text(statement))
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    "empty_db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_key_owners_move_to_their_namespace_and_back(empty_db_url: str) -> None:
    await asyncio.to_thread(upgrade, empty_db_url, BEFORE)
    now = "'2027-01-01 00:00:00'"
    await _run(
        empty_db_url,
        "INSERT INTO conversations (id, owner, channel, external_key, created_at, updated_at,"
        f" next_turn_seq) VALUES ('c1', 'alice', 'api', 'k', {now}, {now}, 0),"
        f" ('c2', 'alice', 'openai', 'k', {now}, {now}, 0),"
        f" ('c3', 'telegram:support', 'telegram:support', 'chat:1', {now}, {now}, 0)",
        "INSERT INTO openai_exchanges (turn_id, conversation_id, owner, context_hash, api,"
        f" stored, created_at) VALUES ('t1', 'c2', 'alice', 'h', 'responses', true, {now})",
    )
    await asyncio.to_thread(upgrade, empty_db_url, AFTER)
    owners = await _rows(empty_db_url, "SELECT id, owner FROM conversations ORDER BY id")
    assert owners == [("c1", "key:alice"), ("c2", "key:alice"), ("c3", "telegram:support")]
    assert await _rows(empty_db_url, "SELECT owner FROM openai_exchanges") == [("key:alice",)]

    await asyncio.to_thread(downgrade, empty_db_url, BEFORE)
    owners = await _rows(empty_db_url, "SELECT id, owner FROM conversations ORDER BY id")
    assert owners == [("c1", "alice"), ("c2", "alice"), ("c3", "telegram:support")]
    assert await _rows(empty_db_url, "SELECT owner FROM openai_exchanges") == [("alice",)]
