"""``/readyz`` under load: many probes at once, while replies stream, on PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event

from bot.http.keys import DB_PROBE
from bot.ops.recent_answer import RecentAnswer
from tests.conftest import MakeClient, issue_key
from tests.ops.helpers import chat

PROBES_AT_ONCE = 8
ROUNDS = 15


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_readyz_stays_200_on_one_kept_connection_while_replies_stream(
    db_url: str, make_client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Load balancers, Docker and orchestrators probe at once: every probe is answered 200,
    and all of them by the probe's one kept connection (no new server process per probe)."""
    client = await make_client(db_url, workers={"poll_interval_s": 60})
    app: Any = client.server.app
    # Every probe makes the round trip: statements that just completed would spare it.
    monkeypatch.setattr(RecentAnswer, "fresh", lambda *_, **__: False)
    connects = []
    event.listen(app[DB_PROBE].sync_engine, "connect", lambda *_: connects.append(1))
    assert (await client.get("/readyz")).status == 200
    assert len(connects) == 1

    key = await issue_key(db_url)
    streaming = [
        asyncio.create_task(chat(client, key, f"c{index}", f"m{index}", "Tell me a story"))
        for index in range(4)
    ]
    statuses: list[int] = []
    while not all(task.done() for task in streaming) or len(statuses) < ROUNDS * PROBES_AT_ONCE:
        answers = await asyncio.gather(*(client.get("/readyz") for _ in range(PROBES_AT_ONCE)))
        statuses += [answer.status for answer in answers]
        await asyncio.sleep(0.05)
    finals = await asyncio.gather(*streaming)

    assert [final["kind"] for final in finals] == ["done"] * 4
    assert set(statuses) == {200}, statuses
    assert len(connects) == 1, "a probe opened a connection of its own"
