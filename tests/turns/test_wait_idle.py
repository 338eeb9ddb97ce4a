"""``TurnService.wait_idle``: a wait that gives up leaves the conversations' work running."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, read_sse
from tests.ops.slow_engine import SlowEngine


async def test_a_wait_that_times_out_leaves_the_queued_turns_to_their_worker(
    db_url: str, make_client: MakeClient, engine: Any
) -> None:
    # The claims poll (which would start a queued turn a stopped worker left) waits a
    # minute: only the conversation's worker can answer the second message in time.
    slow = SlowEngine(engine, delay_s=0.02)
    client = await make_client(db_url, engine_override=slow, workers={"poll_interval_s": 60})
    key = await issue_key(db_url)
    streams = []
    for message_id in ("m1", "m2"):
        message = {"conversation_id": "c1", "message_id": message_id, "text": "Hi"}
        response = await client.post("/v1/messages", json=message, headers=auth(key))
        assert response.status == 202
        streams.append((await response.json())["stream_url"])

    with pytest.raises(TimeoutError):
        await client.server.app[TURNS].wait_idle(timeout=0.2)

    async with asyncio.timeout(30):
        for url in streams:
            events = await read_sse(await client.get(url, headers=auth(key)))
            assert events[-1].kind == "done", events[-1]
