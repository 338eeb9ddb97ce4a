"""A turn someone stopped reads "stopped" wherever a status is shown, and counts apart from failed.

Real app, real engine (slowed so a reply can be stopped half-way), SQLite and
PostgreSQL; botctl in-process.
"""

from __future__ import annotations

import json

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.engines import SlowEngine
from tests.helpers import auth, read_sse
from tests.ops.helpers import botctl


async def test_a_stopped_turn_is_stopped_in_the_api_the_cli_and_usage(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    client = await make_client(
        db_url, engine_override=SlowEngine(engine, 0.02), generation={"max_tokens": 600}
    )
    key = await issue_key(db_url)
    body = await (
        await client.post(
            "/v1/messages",
            json={"conversation_id": "c1", "message_id": "m1", "text": "Tell me a story"},
            headers=auth(key),
        )
    ).json()
    stream = await client.get(body["stream_url"], headers=auth(key))
    await stream.content.readline()  # the reply is being written
    cancel = await client.post(f"/v1/turns/{body['turn_id']}/cancel", headers=auth(key))
    assert (await cancel.json())["cancelled"] is True
    assert (await read_sse(stream))[-1].data["error_class"] == "cancelled"
    await client.server.app[TURNS].wait_idle(timeout=60)

    turn = await (await client.get(f"/v1/turns/{body['turn_id']}", headers=auth(key))).json()
    assert turn["status"] == "stopped" and turn["error_class"] == "cancelled"
    listed = await (await client.get("/v1/conversations/c1/turns", headers=auth(key))).json()
    assert [entry["status"] for entry in listed["turns"]] == ["stopped"]
    today = (await (await client.get("/v1/usage", headers=auth(key))).json())["today"]
    assert (today["turns_failed"], today["turns_stopped"]) == (0, 1)

    env = {"BOT_DATABASE__URL": db_url, "BOT_CONFIG": ""}
    shown = await botctl("conversations", "show", "c1", env=env)
    assert [entry["status"] for entry in json.loads(shown.stdout)["turns"]] == ["stopped"]
    usage = [
        json.loads(line) for line in (await botctl("usage", "--json", env=env)).stdout.splitlines()
    ]
    assert [(row["turns_failed"], row["turns_stopped"]) for row in usage] == [(0, 1)]
    table = (await botctl("usage", env=env)).stdout.splitlines()
    assert "stopped" in table[0].split()
