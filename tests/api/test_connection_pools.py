"""On PostgreSQL requests and turns have database connections of their own (``ServiceEngines``)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import DB_ENGINES
from bot.storage.db import SERVICE_POOL
from bot.storage.models import TurnStatus
from tests.conftest import MakeClient, issue_key
from tests.engines import GatedEngine
from tests.helpers import auth, load_turns, read_sse, reply_text, wait_until

pytestmark = pytest.mark.postgres

CAPACITY = SERVICE_POOL["pool_size"] + SERVICE_POOL["max_overflow"]
"""Every connection one of the pools may open."""


async def test_an_ack_never_waits_for_the_connections_the_turns_hold(
    pg_url: str, make_client: MakeClient
) -> None:
    """Hundreds of turns starting, saving their replies so far and ending at once held
    every pooled connection, and acks waited up to 0.7 s for one (bench/load.py, PostgreSQL).
    With every connection the turns' work may open taken, a message is still
    acknowledged at once and stored; its turn runs once the turns have theirs back."""
    client = await make_client(pg_url)
    key = await issue_key(pg_url)
    turns_engine = client.app[DB_ENGINES].turns
    async with contextlib.AsyncExitStack() as held:
        for _ in range(CAPACITY):
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


async def test_a_turn_ends_with_the_requests_connections_all_taken(
    pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    """The turns' work keeps off the requests' pool: a turn whose final write needed a
    request connection would wait behind the acks (and they behind it)."""
    gated = GatedEngine(engine)
    client = await make_client(pg_url, engine_override=gated)
    key = await issue_key(pg_url)
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": "c1", "message_id": "m1", "text": "Hello there!"},
        headers=auth(key),
    )
    assert response.status == 202
    await wait_until(lambda: gated.waiting == 1, timeout_s=10)  # started, not generating
    requests_engine = client.app[DB_ENGINES].requests
    async with contextlib.AsyncExitStack() as held:
        for _ in range(CAPACITY):
            await held.enter_async_context(requests_engine.connect())
        gated.gate.set()
        async with asyncio.timeout(20):  # a checkout from a full pool waits 30 s
            while True:
                if [turn.status for turn in await load_turns(pg_url)] == [TurnStatus.DONE]:
                    break
                await asyncio.sleep(0.05)
