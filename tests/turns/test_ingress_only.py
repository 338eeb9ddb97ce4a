"""An ingress-only process (``workers.run_turns = false``) beside a worker, on real PostgreSQL.

The ingress process stores and acknowledges; the worker, woken by the accept's
``pg_notify``, runs the turn. The worker polls only every 30 s here, and leaves
a fresh turn to its accepter for ``FRESH_TURN_GRACE`` (2 s): a turn answered in
well under that came by the wake-up.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from aiohttp.test_utils import TestClient
from sqlalchemy import func, update
from sqlalchemy.ext.asyncio import create_async_engine

from bot.config import ConfigError, load_settings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from bot.storage.models import Turn
from bot.turns.leases import FRESH_TURN_GRACE, LeasedClaims
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, load_turns, read_sse, terminate_backends

LEASE = timedelta(seconds=30)


async def worker_and_ingress(
    pg_url: str, make_client: MakeClient, *, poll_interval_s: float
) -> tuple[TestClient, LeasedClaims, TestClient]:
    """A worker listening for wake-ups and an ingress-only process, on one database."""
    worker = await make_client(pg_url, workers={"id": "worker", "poll_interval_s": poll_interval_s})
    ingress = await make_client(pg_url, workers={"id": "ingress", "run_turns": False})
    claims = worker.app[TURNS].claims
    assert isinstance(claims, LeasedClaims) and claims.wakeups is not None
    await asyncio.wait_for(claims.wakeups.listening.wait(), 10)
    return worker, claims, ingress


async def answered(ingress: TestClient, key: str, message_id: str, text: str) -> tuple[str, float]:
    """Send through the ingress and read the reply there: (turn id, seconds to its end)."""
    message = {"conversation_id": "c1", "message_id": message_id, "text": text}
    started = time.monotonic()
    response = await ingress.post("/v1/messages", json=message, headers=auth(key))
    assert response.status == 202
    body = await response.json()
    # Read from the ingress process: it follows the turn's row.
    events = await asyncio.wait_for(
        read_sse(await ingress.get(body["stream_url"], headers=auth(key))), 20
    )
    assert events[-1].kind == "done"
    return body["turn_id"], time.monotonic() - started


async def test_a_worker_runs_the_turns_an_ingress_only_process_accepts(
    pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    _, _, ingress = await worker_and_ingress(pg_url, make_client, poll_interval_s=30)
    key = await issue_key(pg_url)

    turn_ids = []
    for index, text in enumerate(["Hello there", "And again"]):
        turn_id, took_s = await answered(ingress, key, f"m{index}", text)
        assert took_s < FRESH_TURN_GRACE.total_seconds()
        turn_ids.append(turn_id)

    rows = await load_turns(pg_url)
    assert sorted(row.id for row in rows) == sorted(turn_ids)
    assert [row.seq for row in rows] == [0, 1]
    assert all(row.status == "done" and row.reply_text for row in rows)
    assert all(row.lease_owner in (None, "worker") for row in rows)


async def test_a_turn_accepted_while_the_worker_is_not_listening_is_still_answered(
    pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    """The wake-up is lost with the listening connection; the poller finds the turn."""
    _, claims, ingress = await worker_and_ingress(pg_url, make_client, poll_interval_s=0.5)
    key = await issue_key(pg_url)
    assert await terminate_backends(pg_url, "query LIKE 'LISTEN%'") == 1

    # Sent into the cut: nobody hears it; the poller takes it after the fresh-turn grace.
    _, took_s = await answered(ingress, key, "m1", "Hello there")
    assert took_s >= FRESH_TURN_GRACE.total_seconds()
    # The listener is back within a poll interval, and wakes the worker again.
    assert claims.wakeups is not None
    await asyncio.wait_for(claims.wakeups.listening.wait(), 10)
    _, took_s = await answered(ingress, key, "m2", "And again")
    assert took_s < FRESH_TURN_GRACE.total_seconds()
    assert [(row.seq, row.status) for row in await load_turns(pg_url)] == [
        (0, "done"),
        (1, "done"),
    ]


async def test_an_ingress_only_process_is_ready_without_running_turns(
    pg_url: str, make_client: MakeClient
) -> None:
    ingress = await make_client(pg_url, workers={"run_turns": False})
    response = await ingress.get("/readyz")
    assert response.status == 200
    key = await issue_key(pg_url)
    message = {"conversation_id": "c2", "message_id": "m1", "text": "Anyone there?"}
    response = await ingress.post("/v1/messages", json=message, headers=auth(key))
    assert response.status == 202
    turn_id = (await response.json())["turn_id"]
    await asyncio.sleep(0.5)
    # No worker: the turn waits, queued, for one.
    turn = await (await ingress.get(f"/v1/turns/{turn_id}", headers=auth(key))).json()
    assert turn["status"] == "queued"
    assert ingress.app[TURNS].in_flight == 0


def test_ingress_only_is_refused_on_sqlite() -> None:
    with pytest.raises(ConfigError, match="run_turns"):
        load_settings(
            None,
            database={"url": "sqlite+aiosqlite:///bot.db"},
            workers={"run_turns": False},
        )


async def test_an_ingress_only_process_hands_back_no_lease_when_it_stops(
    pg_url: str, make_client: MakeClient
) -> None:
    """Both units read one bot.toml: a ``workers.id`` set there names the worker and the
    ingress alike. The ingress claims nothing, so its stop leaves the worker's claims be."""
    ingress = await make_client(pg_url, workers={"id": "shared", "run_turns": False})
    key = await issue_key(pg_url)
    message = {"conversation_id": "c1", "message_id": "m1", "text": "Hello"}
    response = await ingress.post("/v1/messages", json=message, headers=auth(key))
    assert response.status == 202
    # The worker called "shared" has claimed the turn and is about to start it.
    engine = create_async_engine(pg_url)
    try:
        async with engine.begin() as connection:
            await connection.execute(
                update(Turn).values(lease_owner="shared", lease_expires_at=func.now() + LEASE)
            )
    finally:
        await engine.dispose()

    await ingress.close()

    [turn] = await load_turns(pg_url)
    assert (turn.status, turn.lease_owner) == ("queued", "shared")
