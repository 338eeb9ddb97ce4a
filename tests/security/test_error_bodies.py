"""Error answers tell clients what they may know; the details go to the log with the request id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiosqlite
from structlog.testing import capture_logs

from bot.engine.base import GenerationRequest
from bot.errors import USER_MESSAGES, EngineError, ErrorClass
from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.engines import DownEngine
from tests.helpers import auth, load_turns

INTERNAL_URL = "http://10.9.8.7:8000/v1/completions"


class LeakyDownEngine(DownEngine):
    """Down, with errors that name the internal server, as real clients' errors do."""

    async def generate(self, request: GenerationRequest) -> Any:
        raise EngineError(ErrorClass.NETWORK, f"cannot connect to {INTERNAL_URL}")
        yield  # pragma: no cover - makes this an async generator

    async def check_health(self) -> None:
        raise EngineError(ErrorClass.ENGINE_UNAVAILABLE, f"{INTERNAL_URL}: connection refused")


async def test_failed_turns_and_readyz_do_not_name_internal_servers(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url, engine_override=LeakyDownEngine())
    key = await issue_key(sqlite_url)
    posted = await client.post(
        "/v1/messages",
        json={"conversation_id": "c1", "message_id": "m1", "text": "hi"},
        headers=auth(key),
    )
    turn_id = (await posted.json())["turn_id"]
    await client.app[TURNS].wait_idle(timeout=60)
    [turn] = await load_turns(sqlite_url)
    assert INTERNAL_URL in (turn.error_message or ""), "the operator keeps the detail"

    document = await (await client.get(f"/v1/turns/{turn_id}", headers=auth(key))).json()
    assert document["status"] == "failed"
    assert document["error"] == USER_MESSAGES[ErrorClass.NETWORK]
    history = await client.get("/v1/conversations/c1/turns", headers=auth(key))
    events = await client.get(f"/v1/turns/{turn_id}/events", headers=auth(key))
    with capture_logs() as logs:
        ready = await client.get("/readyz")
    assert ready.status == 503
    for response in (history, events, ready):
        assert "10.9.8.7" not in await response.text()
    assert any("10.9.8.7" in str(entry.get("error")) for entry in logs)


async def test_an_unexpected_failure_is_a_json_500_with_only_the_request_id(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    # The keys table vanishes under the running service: authentication cannot work.
    database = Path(sqlite_url.split("///", 1)[1])
    async with aiosqlite.connect(database) as connection:
        await connection.execute("DROP TABLE api_keys")
        await connection.commit()
    with capture_logs() as logs:
        response = await client.post(
            "/v1/messages",
            json={"conversation_id": "c1", "message_id": "m1", "text": "hi"},
            headers=auth(key),
        )
    assert response.status == 500
    body = await response.json()
    assert body["error"] == "internal"
    assert "api_keys" not in json.dumps(body), "no exception text"
    [failure] = [entry for entry in logs if entry["event"] == "request_failed"]
    assert failure["request_id"] == body["request_id"]
    assert failure["exc_info"]


async def test_unknown_paths_and_methods_get_json(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    missing = await client.get("/no/such/path")
    assert missing.status == 404
    assert (await missing.json())["error"] == "not_found"
    wrong = await client.delete("/v1/messages")
    assert wrong.status == 405
    assert (await wrong.json())["error"] == "method_not_allowed"
    assert "POST" in wrong.headers["Allow"]
