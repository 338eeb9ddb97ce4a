"""A message_id names one message: the same id and text is the same turn, another text a 409.

Real app on loopback, real vLLM, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio

from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, count_rows, read_sse


def message(conversation: str, message_id: str, text: str) -> dict[str, str]:
    return {"conversation_id": conversation, "message_id": message_id, "text": text}


async def test_a_reused_message_id_with_another_text_is_a_conflict_and_stores_nothing(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    first = await client.post(
        "/v1/messages", json=message("c1", "m1", "What is 2 + 2?"), headers=auth(key)
    )
    assert first.status == 202
    turn_id = (await first.json())["turn_id"]

    again = await client.post(
        "/v1/messages", json=message("c1", "m1", "What is 2 + 2?"), headers=auth(key)
    )
    assert again.status == 202
    assert (await again.json())["turn_id"] == turn_id
    assert (await again.json())["duplicate"] is True

    other = await client.post(
        "/v1/messages",
        json=message("c1", "m1", "What is the capital of France?"),
        headers=auth(key),
    )
    assert other.status == 409
    refusal = await other.json()
    assert refusal["error"] == "conflict"
    assert "message_id" in refusal["reason"] and "another text" in refusal["reason"]
    assert "France" not in refusal["reason"], "the user's text is not said back"
    assert refusal["turn_id"] == turn_id

    # Streamed, the same refusal; and the stream slot it reserved is given back.
    streamed = await client.post(
        "/v1/messages",
        json=message("c1", "m1", "Another question"),
        headers={**auth(key), "Accept": "text/event-stream"},
    )
    assert streamed.status == 409
    assert (await streamed.json())["error"] == "conflict"

    await client.server.app[TURNS].wait_idle(timeout=60)
    counts = await count_rows(db_url)
    assert counts["turns"] == 1 and counts["inbound_events"] == 1

    # The same id in another conversation is another message (ids are per conversation).
    elsewhere = await client.post(
        "/v1/messages", json=message("c2", "m1", "Something else"), headers=auth(key)
    )
    assert elsewhere.status == 202 and (await elsewhere.json())["duplicate"] is False
    events = await read_sse(await client.get(f"/v1/turns/{turn_id}/events", headers=auth(key)))
    assert events[-1].kind == "done"


async def test_two_texts_racing_for_one_id_make_one_turn_and_one_conflict(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    responses = await asyncio.gather(
        client.post("/v1/messages", json=message("c1", "m1", "first text"), headers=auth(key)),
        client.post("/v1/messages", json=message("c1", "m1", "second text"), headers=auth(key)),
    )
    assert sorted(response.status for response in responses) == [202, 409]
    await client.server.app[TURNS].wait_idle(timeout=60)
    assert (await count_rows(db_url))["turns"] == 1


async def test_a_text_the_store_had_to_clean_is_still_the_same_message(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    text = "a NUL \u0000 inside"  # stored with U+FFFD in its place (PostgreSQL refuses U+0000)
    first = await client.post("/v1/messages", json=message("c1", "m1", text), headers=auth(key))
    assert first.status == 202
    again = await client.post("/v1/messages", json=message("c1", "m1", text), headers=auth(key))
    assert again.status == 202, await again.text()
    assert (await again.json())["duplicate"] is True
    await client.server.app[TURNS].wait_idle(timeout=60)
