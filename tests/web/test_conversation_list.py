"""``GET /v1/conversations``: the list the page switches between, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from aiohttp.test_utils import TestClient
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from structlog.testing import capture_logs

from bot.http.keys import READ_SESSIONS, TURNS
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Conversation, Turn
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, refusal
from tests.ops.helpers import chat
from tests.security.test_hostile_input import issue_admin_only_key

LONG = "Please explain how the prefix cache decides which blocks of a long prompt it reuses"


async def listed(client: TestClient[Any, Any], key: str, query: str = "") -> dict[str, Any]:
    response = await client.get(f"/v1/conversations{query}", headers=auth(key))
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def every_page(client: TestClient[Any, Any], key: str, limit: int) -> list[dict[str, Any]]:
    """Every conversation, read ``limit`` at a time by following ``next_cursor``."""
    found: list[dict[str, Any]] = []
    body = await listed(client, key, f"?limit={limit}")
    while True:
        assert len(body["conversations"]) <= limit
        found += body["conversations"]
        if body["next_cursor"] is None:
            return found
        assert len(body["conversations"]) == limit
        body = await listed(client, key, f"?limit={limit}&cursor={body['next_cursor']}")


async def test_the_owners_conversations_newest_first_with_titles(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    alice = await issue_key(db_url, "laptop", owner="alice")
    phone = await issue_key(db_url, "phone", owner="alice")
    bob = await issue_key(db_url, "bob")
    assert (await listed(client, alice)) == {"conversations": [], "next_cursor": None}

    for key, conversation, message_id, text in [
        (alice, "trip", "m0", "Where should we go\nin May?"),
        (alice, "cache", "m0", LONG),
        (phone, "short", "m0", "Hi"),
        (bob, "bobs", "m0", "Bob's secret plan"),
        # A later message moves its conversation to the top; its title stays the first one.
        (alice, "trip", "m1", "And in June?"),
    ]:
        assert (await chat(client, key, conversation, message_id, text))["kind"] == "done"
    await client.app[TURNS].wait_idle(timeout=60)

    body = await listed(client, alice)
    assert body["next_cursor"] is None
    conversations = body["conversations"]
    assert [c["conversation_id"] for c in conversations] == ["trip", "short", "cache"]
    assert [c["title"] for c in conversations] == [
        "Where should we go in May?",
        "Hi",
        "Please explain how the prefix cache decides which…",
    ]
    trip = conversations[0]
    assert trip["persona"] is None
    created = dt.datetime.fromisoformat(trip["created_at"])
    updated = dt.datetime.fromisoformat(trip["updated_at"])
    assert created.tzinfo is not None and created < updated
    assert updated > dt.datetime.fromisoformat(conversations[1]["updated_at"])
    # Another key of the same owner sees the same list; another owner only theirs.
    assert (await listed(client, phone)) == body
    bobs = (await listed(client, bob))["conversations"]
    assert [(c["conversation_id"], c["title"]) for c in bobs] == [("bobs", "Bob's secret plan")]

    # Pages of one follow each other with no conversation twice or missed.
    assert await every_page(client, alice, 1) == conversations
    assert await every_page(client, alice, 2) == conversations


async def test_pages_split_conversations_updated_at_the_same_instant(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url, owner="alice")
    same = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session, session.begin():
            for index in range(7):
                conversation = Conversation(
                    owner="key:alice", channel="api", external_key=f"c{index}", updated_at=same
                )
                session.add(conversation)
                await session.flush()
                session.add(
                    Turn(
                        conversation_id=conversation.id,
                        seq=0,
                        channel="api",
                        user_text=f"Message {index}",
                        status="done",
                    )
                )
            # Not listed: a closed conversation, and one of another channel.
            session.add(
                Conversation(owner="key:alice", channel="api", external_key="old", closed_at=same)
            )
            session.add(Conversation(owner="key:alice", channel="openai", external_key="x"))
    finally:
        await engine.dispose()

    whole = (await listed(client, key, "?limit=100"))["conversations"]
    assert sorted(c["conversation_id"] for c in whole) == [f"c{i}" for i in range(7)]
    assert {c["title"] for c in whole} == {f"Message {i}" for i in range(7)}
    for limit in (1, 2, 3):
        assert await every_page(client, key, limit) == whole


async def test_bad_queries_and_keys_are_refused(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    for query in ("limit=0", "limit=101", "limit=x", "limit=1.5", "limit=-1", "limit=٣"):
        response = await client.get(f"/v1/conversations?{query}", headers=auth(key))
        assert "limit" in (await refusal(response, 400))["reason"], query
    for cursor in (
        "x",
        "AAAA",
        "not base64!",
        "MjAyNnxhYg",  # "2026|ab"
        "Zm9vfGJhcg",  # "foo|bar"
        "MjAyNi0wMS0wMVQwMDowMDowMHxhYg",  # a time without its zone
        "é",
        "A" * 300,
    ):
        response = await client.get(
            "/v1/conversations", params={"cursor": cursor}, headers=auth(key)
        )
        assert "cursor" in (await refusal(response, 400))["reason"], cursor
    await refusal(await client.get("/v1/conversations"), 401)
    await refusal(await client.get("/v1/conversations", headers=auth("bot_nope_wrong")), 401)
    admin = await issue_admin_only_key(db_url)
    await refusal(await client.get("/v1/conversations", headers=auth(admin)), 403)


async def test_a_database_that_fails_the_listing_is_a_503_with_a_reason(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    assert (await chat(client, key, "c1", "m0", "A secret first message"))["kind"] == "done"
    await client.app[TURNS].wait_idle(timeout=60)
    # The connection is lost just as the listing's statement goes out.
    engine = client.app[READ_SESSIONS].kw["bind"].sync_engine

    def lose_connection(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "substr" in statement.lower():
            raise OperationalError(statement, {}, Exception("server closed the connection"))

    event.listen(engine, "before_cursor_execute", lose_connection)
    try:
        with capture_logs() as logs:
            response = await client.get("/v1/conversations", headers=auth(key))
            body = await refusal(response, 503)
    finally:
        event.remove(engine, "before_cursor_execute", lose_connection)
    assert "secret" not in json.dumps(body) and "secret" not in json.dumps(logs, default=str)
    # The database answers again: so does the listing.
    assert [c["title"] for c in (await listed(client, key))["conversations"]] == [
        "A secret first message"
    ]
