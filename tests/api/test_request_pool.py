"""On PostgreSQL the acks have database connections of their own (``ServiceEngines``)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bot.http.keys import DB_ENGINES
from bot.storage.db import SERVICE_POOL
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, load_turns, read_sse, reply_text

pytestmark = pytest.mark.postgres


async def test_an_ack_never_waits_for_the_connections_the_turns_hold(
    pg_url: str, make_client: MakeClient
) -> None:
    """Hundreds of turns starting, saving their replies so far and ending at once held
    every pooled connection, and acks waited up to 0.7 s for one (bench/connection_waits.py).
    With every connection the turns' work may open taken, a message is still
    acknowledged at once and stored; its turn runs once the turns have theirs back."""
    client = await make_client(pg_url)
    key = await issue_key(pg_url)
    turns_engine = client.app[DB_ENGINES].turns
    capacity = SERVICE_POOL["pool_size"] + SERVICE_POOL["max_overflow"]
    async with contextlib.AsyncExitStack() as held:
        for _ in range(capacity):
            await held.enter_async_context(turns_engine.connect())
        async with asyncio.timeout(5):  # a checkout from a full pool waits 30 s
            response = await client.post(
                "/v1/messages",
                json={"conversation_id": "c1", "message_id": "m1", "text": "Hello there!"},
                headers=auth(key),
            )
        assert response.status == 202
        body = await response.json()
        assert [turn.id for turn in await load_turns(pg_url)] == [body["turn_id"]]
    async with asyncio.timeout(60):
        events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done"
    assert reply_text(events) != ""
