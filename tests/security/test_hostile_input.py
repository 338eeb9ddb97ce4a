"""Hostile input gets a 4xx with a JSON reason and stores nothing, never a 500."""

from __future__ import annotations

import pytest

from bot.apikeys import create_key
from bot.http.keys import TURNS
from bot.storage.db import create_engine, create_sessionmaker
from tests.conftest import MakeClient, issue_key
from tests.helpers import (
    DEEP,
    assert_nothing_stored,
    auth,
    count_rows,
    huge_integer_field,
    nested,
    refusal,
)

CYRILLIC_ID = "Ж" * 76


async def issue_admin_only_key(db_url: str) -> str:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            issued = await create_key(session, name="ops", scopes=("admin",))
        return issued.key
    finally:
        await engine.dispose()


# -- HTTP API --------------------------------------------------------------------------


async def test_deeply_nested_json_is_a_400(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    # As sent by the attacker (60,000 openers), and a well-formed one under the size limit.
    for body in (nested(DEEP, closed=False), nested(DEEP // 2, closed=True)):
        response = await client.post("/v1/messages", data=body, headers=auth(key))
        assert "deeply" in (await refusal(response, 400))["reason"]
    await assert_nothing_stored(sqlite_url)


@pytest.mark.parametrize("field", ["user_id", "conversation_id", "text"])
async def test_a_5000_digit_integer_is_a_400(
    sqlite_url: str, make_client: MakeClient, field: str
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    response = await client.post("/v1/messages", data=huge_integer_field(field), headers=auth(key))
    await refusal(response, 400)
    await assert_nothing_stored(sqlite_url)


async def test_a_key_without_the_chat_scope_gets_403_everywhere(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    admin = auth(await issue_admin_only_key(sqlite_url))
    document = {"conversation_id": "c1", "message_id": "m1", "text": "hi"}
    await refusal(await client.post("/v1/messages", json=document, headers=admin), 403)
    await assert_nothing_stored(sqlite_url)
    # A turn of someone else is not even looked up.
    chat = auth(await issue_key(sqlite_url))
    accepted = await (await client.post("/v1/messages", json=document, headers=chat)).json()
    turn = accepted["turn_id"]
    for method, path in [
        ("GET", f"/v1/turns/{turn}"),
        ("GET", f"/v1/turns/{turn}/events"),
        ("POST", f"/v1/turns/{turn}/cancel"),
        ("GET", "/v1/conversations/c1/turns"),
    ]:
        await refusal(await client.request(method, path, headers=admin), 403)
    await client.app[TURNS].wait_idle(timeout=120)


async def test_long_non_ascii_ids_are_accepted_and_deduplicated(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    document = {"conversation_id": CYRILLIC_ID, "message_id": "Ё" * 200, "text": "Привет"}
    first = await client.post("/v1/messages", json=document, headers=auth(key))
    assert first.status == 202, await first.text()
    again = await client.post("/v1/messages", json=document, headers=auth(key))
    assert again.status == 202
    assert (await again.json())["duplicate"] is True
    assert (await again.json())["turn_id"] == (await first.json())["turn_id"]
    await client.app[TURNS].wait_idle(timeout=120)
    assert (await count_rows(db_url))["turns"] == 1
