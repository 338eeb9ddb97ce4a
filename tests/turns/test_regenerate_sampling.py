"""A regeneration asks for another reply: it samples at ``generation.regenerate_temperature``.

With greedy decoding (the default ``temperature`` 0) a regeneration would repeat
the reply it replaces, id for id. First answers stay greedy; regenerations are
sampled at ``regenerate_temperature`` (0.7 by default), so three of them give at
least one other reply; set to 0, they are greedy again.
"""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from bot.engine.vllm_local import LocalVLLMEngine
from tests.conftest import MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.helpers import auth
from tests.turns.test_history_tree import fork, say

QUESTION = "Tell me about the weather in Paris."


async def _reply(client: TestClient[Any, Any], key: str, turn_id: str) -> str:
    document = await (await client.get(f"/v1/turns/{turn_id}", headers=auth(key))).json()
    return str(document["reply"])


async def test_regenerations_are_sampled_and_first_answers_stay_greedy(
    db_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    spy = RecordingEngine(engine)
    client = await make_client(db_url, engine_override=spy)
    key = await issue_key(db_url)
    first = await say(client, key, "m0", QUESTION)
    original = await _reply(client, key, first)
    latest = first
    replies = []
    for _ in range(3):
        latest = await fork(client, key, latest, "regenerate")
        replies.append(await _reply(client, key, latest))
    assert any(reply != original for reply in replies), (original, replies)
    first_call, *regenerations = spy.calls
    assert first_call.request.temperature == 0.0
    assert {call.request.temperature for call in regenerations} == {0.7}
    assert {call.request.seed for call in regenerations} == {None}


async def test_a_regenerate_temperature_of_0_keeps_regenerations_greedy(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url, generation={"regenerate_temperature": 0})
    key = await issue_key(sqlite_url)
    first = await say(client, key, "m0", QUESTION)
    again = await fork(client, key, first, "regenerate")
    assert await _reply(client, key, again) == await _reply(client, key, first)
