"""The HTTP API end to end: real app on loopback, real vLLM, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json

import pytest

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from bot.storage.models import as_utc
from tests.conftest import MakeClient, issue_key
from tests.engines import MeetingEngine
from tests.helpers import (
    SPEC_LAYERS,
    auth,
    count_rows,
    load_messages,
    load_turns,
    read_sse,
    reply_text,
)


def message(conversation: str, message_id: str, text: str = "Hello there!") -> dict[str, str]:
    return {"conversation_id": conversation, "message_id": message_id, "text": text}


async def test_post_acknowledges_then_streams(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)

    response = await client.post("/v1/messages", json=message("c1", "m1"), headers=auth(key))
    assert response.status == 202
    body = await response.json()
    assert body["conversation_id"] == "c1"
    assert body["stream_url"] == f"/v1/turns/{body['turn_id']}/events"
    assert body["duplicate"] is False

    events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    kinds = [event.kind for event in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"delta"}
    done = events[-1].data
    assert done["text"] == reply_text(events) != ""
    assert done["usage"]["prompt_tokens"] > 0
    assert done["usage"]["completion_tokens"] > 0
    for layer in SPEC_LAYERS:
        assert layer in done["timings_ms"]
    assert done["timings_ms"]["ttft"] > 0
    assert done["timings_ms"]["e2e"] >= done["timings_ms"]["ttft"]

    status = await (await client.get(f"/v1/turns/{body['turn_id']}", headers=auth(key))).json()
    assert status["status"] == "done"
    assert status["reply"] == done["text"]
    assert status["usage"]["completion_tokens"] == done["usage"]["completion_tokens"]


async def test_post_with_event_stream_accept_streams_the_reply(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    response = await client.post(
        "/v1/messages",
        json=message("c1", "m1"),
        headers={**auth(key), "Accept": "text/event-stream"},
    )
    events = await read_sse(response)
    assert events[-1].kind == "done"
    assert events[-1].data["text"] == reply_text(events)


async def test_late_subscriber_gets_the_whole_reply_and_can_resume(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    body = await (
        await client.post("/v1/messages", json=message("c1", "m1"), headers=auth(key))
    ).json()
    first = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    full = first[-1].data["text"]

    # Long after the end: one delta with everything, then done.
    late = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    assert reply_text(late) == full
    assert late[-1].kind == "done"

    # Resuming after the 5th character returns only the rest.
    resumed = await read_sse(
        await client.get(body["stream_url"], headers={**auth(key), "Last-Event-ID": "5"})
    )
    assert reply_text(resumed) == full[5:]

    # After the in-memory stream is gone, the stored turn serves the same.
    client.server.app[TURNS].streams._streams.clear()
    stored = await read_sse(
        await client.get(body["stream_url"], headers={**auth(key), "Last-Event-ID": "3"})
    )
    assert reply_text(stored) == full[3:]
    assert stored[-1].data["usage"] == {**first[-1].data["usage"]}


async def test_same_message_id_is_one_turn_and_one_generation(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    responses = await asyncio.gather(
        *(
            client.post("/v1/messages", json=message("c1", "m1"), headers=auth(key))
            for _ in range(4)
        )
    )
    bodies = [await response.json() for response in responses]
    assert {response.status for response in responses} == {202}
    assert len({body["turn_id"] for body in bodies}) == 1
    assert sorted(body["duplicate"] for body in bodies) == [False, True, True, True]
    await client.server.app[TURNS].wait_idle(timeout=60)
    counts = await count_rows(db_url)
    assert counts["turns"] == 1 and counts["inbound_events"] == 1
    # One user and one assistant entry: generated once.
    assert counts["messages"] == 2


async def test_turns_of_one_conversation_run_in_order(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    responses = await asyncio.gather(
        *(
            client.post(
                "/v1/messages", json=message("c1", f"m{i}", f"message {i}"), headers=auth(key)
            )
            for i in range(5)
        )
    )
    assert {response.status for response in responses} == {202}
    await client.server.app[TURNS].wait_idle(timeout=120)
    turns = sorted(await load_turns(db_url), key=lambda turn: turn.seq)
    assert [turn.status for turn in turns] == ["done"] * 5
    for earlier, later in itertools.pairwise(turns):
        assert earlier.finished_at is not None and later.started_at is not None
        assert as_utc(later.started_at) >= as_utc(earlier.finished_at)
    # The history holds the exchanges in turn order, user then assistant.
    history = await load_messages(db_url, turns[0].conversation_id)
    assert [(role, turn_id) for role, _, turn_id in history] == [
        (role, turn.id) for turn in turns for role in ("user", "assistant")
    ]


async def test_conversations_run_concurrently(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    client = await make_client(sqlite_url, engine_override=MeetingEngine(engine, 4))
    key = await issue_key(sqlite_url)
    await asyncio.gather(
        *(
            client.post("/v1/messages", json=message(f"c{i}", "m1"), headers=auth(key))
            for i in range(4)
        )
    )
    await client.server.app[TURNS].wait_idle(timeout=120)
    turns = await load_turns(sqlite_url)
    # All four were waiting for the engine at the same time, so all four could start.
    assert [turn.status for turn in turns] == ["done"] * 4


BAD_REQUESTS = [
    pytest.param({}, b"not json at all", 400, "bad_request", id="malformed-json"),
    pytest.param({}, b"[1, 2]", 400, "bad_request", id="json-not-object"),
    pytest.param(
        {},
        json.dumps({"conversation_id": "c1", "text": "hi"}).encode(),
        400,
        "bad_request",
        id="missing-message-id",
    ),
    pytest.param(
        {},
        json.dumps({"conversation_id": "c1", "message_id": "m", "text": ""}).encode(),
        400,
        "bad_request",
        id="empty-text",
    ),
    pytest.param(
        {},
        json.dumps({**message("c1", "m1"), "extra": 1}).encode(),
        400,
        "bad_request",
        id="unknown-field",
    ),
    pytest.param(
        {},
        json.dumps(message("c1", "m1", "x" * 2001)).encode(),
        400,
        "bad_request",
        id="text-too-long",
    ),
    pytest.param(
        {},
        json.dumps(message("c1", "m1", "x" * 5000)).encode(),
        413,
        "too_large",
        id="body-too-large",
    ),
]


@pytest.mark.parametrize(("headers", "body", "status", "error"), BAD_REQUESTS)
async def test_bad_input_is_refused_and_nothing_is_stored(
    db_url: str,
    make_client: MakeClient,
    headers: dict[str, str],
    body: bytes,
    status: int,
    error: str,
) -> None:
    client = await make_client(db_url, server={"max_body_bytes": 4096, "max_text_chars": 2000})
    key = await issue_key(db_url)
    response = await client.post(
        "/v1/messages",
        data=body,
        headers={**auth(key), "Content-Type": "application/json", **headers},
    )
    assert response.status == status
    document = await response.json()
    assert document["error"] == error
    assert document["reason"]
    assert await count_rows(db_url) == {
        "conversations": 0,
        "turns": 0,
        "inbound_events": 0,
        "messages": 0,
    }


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-key"),
        pytest.param({"Authorization": "Bearer bot_0000_wrong"}, id="unknown-key"),
        pytest.param({"Authorization": "Basic abc"}, id="wrong-scheme"),
    ],
)
async def test_missing_or_wrong_key_is_401_and_nothing_is_stored(
    db_url: str, make_client: MakeClient, headers: dict[str, str]
) -> None:
    client = await make_client(db_url)
    key = await issue_key(db_url)
    tampered = {"Authorization": f"Bearer {key[:-2]}xx"}
    for attempt in (headers, tampered):
        response = await client.post("/v1/messages", json=message("c1", "m1"), headers=attempt)
        assert response.status == 401
        assert (await response.json())["error"] == "auth"
    assert await count_rows(db_url) == {
        "conversations": 0,
        "turns": 0,
        "inbound_events": 0,
        "messages": 0,
    }


async def test_owners_never_see_each_other(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url)
    alice = await issue_key(db_url, "alice")
    bob = await issue_key(db_url, "bob")
    a = await (
        await client.post("/v1/messages", json=message("shared", "m1"), headers=auth(alice))
    ).json()
    b = await (
        await client.post("/v1/messages", json=message("shared", "m1"), headers=auth(bob))
    ).json()
    assert a["turn_id"] != b["turn_id"] and not b["duplicate"]
    await client.server.app[TURNS].wait_idle(timeout=60)

    for path in (f"/v1/turns/{a['turn_id']}", f"/v1/turns/{a['turn_id']}/events"):
        response = await client.get(path, headers=auth(bob))
        assert response.status == 404
    assert (await client.post(f"/v1/turns/{a['turn_id']}/cancel", headers=auth(bob))).status == 404

    turns = await load_turns(db_url)
    assert len({turn.conversation_id for turn in turns}) == 2
    # Each conversation holds only its own first exchange.
    assert all(turn.seq == 0 for turn in turns)


async def test_cancel_stops_a_running_turn(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url, generation={"max_tokens": 600})
    key = await issue_key(sqlite_url)
    body = await (
        await client.post("/v1/messages", json=message("c1", "m1"), headers=auth(key))
    ).json()
    stream = await client.get(body["stream_url"], headers=auth(key))
    await stream.content.readline()  # the first delta has arrived: generation is under way
    cancel = await client.post(f"/v1/turns/{body['turn_id']}/cancel", headers=auth(key))
    assert (await cancel.json())["cancelled"] is True
    events = await read_sse(stream)
    assert events[-1].kind == "error"
    assert events[-1].data["error_class"] == "cancelled"
    status = await (await client.get(f"/v1/turns/{body['turn_id']}", headers=auth(key))).json()
    assert status["status"] == "stopped" and status["error_class"] == "cancelled"
    assert status["usage"]["completion_tokens"] < 600

    # The service goes on: the next message in the same conversation is answered.
    after = await (
        await client.post("/v1/messages", json=message("c1", "m2"), headers=auth(key))
    ).json()
    events = await read_sse(await client.get(after["stream_url"], headers=auth(key)))
    assert events[-1].kind == "done"


async def test_a_key_in_use_revoked_elsewhere_is_refused_within_a_second(
    sqlite_url: str, make_client: MakeClient
) -> None:
    """Checked keys are trusted briefly without a lookup; a revocation still lands in 1 s."""
    import time

    from sqlalchemy import update

    from bot.apikeys import KEY_CHECK_TTL_S
    from bot.storage.db import create_engine, create_sessionmaker
    from bot.storage.models import ApiKey

    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "busy")
    assert (await client.get("/v1/turns/none", headers=auth(key))).status == 404
    engine = create_engine(sqlite_url)
    async with create_sessionmaker(engine)() as session, session.begin():
        now = dt.datetime.now(dt.UTC)
        await session.execute(update(ApiKey).where(ApiKey.name == "busy").values(revoked_at=now))
    await engine.dispose()
    revoked_at = time.monotonic()
    while (await client.get("/v1/turns/none", headers=auth(key))).status != 401:
        assert time.monotonic() - revoked_at < KEY_CHECK_TTL_S + 0.5
        await asyncio.sleep(0.05)
    assert KEY_CHECK_TTL_S <= 1.0


async def test_expired_and_revoked_keys_are_refused(
    sqlite_url: str, make_client: MakeClient
) -> None:
    from sqlalchemy import update

    from bot.storage.db import create_engine, create_sessionmaker
    from bot.storage.models import ApiKey

    client = await make_client(sqlite_url)
    expired = await issue_key(sqlite_url, "old")
    revoked = await issue_key(sqlite_url, "gone")
    engine = create_engine(sqlite_url)
    async with create_sessionmaker(engine)() as session, session.begin():
        past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
        await session.execute(update(ApiKey).where(ApiKey.name == "old").values(expires_at=past))
        await session.execute(update(ApiKey).where(ApiKey.name == "gone").values(revoked_at=past))
    await engine.dispose()
    for key in (expired, revoked):
        response = await client.post("/v1/messages", json=message("c1", "m1"), headers=auth(key))
        assert response.status == 401
