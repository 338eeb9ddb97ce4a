"""GET /v1/usage: the calling key's day against its limit, and its owner's days, per channel."""

from __future__ import annotations

import datetime as dt

from bot.http.keys import TURNS
from bot.storage.db import create_engine, create_sessionmaker
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, load_turns, store_turns
from tests.ops.helpers import chat

DAILY = 20_000


async def test_usage_of_the_key_and_its_owner(db_url: str, make_client: MakeClient) -> None:
    client = await make_client(db_url, limits={"tokens_per_day": DAILY})
    first = await issue_key(db_url, "laptop", owner="alice")
    second = await issue_key(db_url, "phone", owner="alice")
    bob = await issue_key(db_url, "bob")
    for i in range(2):
        assert (await chat(client, first, "trip", f"m{i}", f"Question {i}"))["kind"] == "done"
    assert (await chat(client, second, "other", "m0", "From the phone"))["kind"] == "done"
    assert (await chat(client, bob, "trip", "m0", "Bob here"))["kind"] == "done"
    await client.server.app[TURNS].wait_idle(timeout=60)
    # A chat platform's tenant that happens to be called "alice" is not alice's usage.
    engine = create_engine(db_url)
    now = dt.datetime.now(dt.UTC)
    await store_turns(
        create_sessionmaker(engine),
        owner="alice",
        channel="telegram:alice",
        key="chat:1",
        turns=[(now, "done", "42", 999, 0, 9)],
    )
    await engine.dispose()
    turns = await load_turns(db_url)
    laptop = [t for t in turns if t.user_text.startswith("Question")]
    everything = [t for t in turns if t.user_text != "Bob here" and t.channel == "api"]

    response = await client.get("/v1/usage", headers=auth(first))
    assert response.status == 200
    body = await response.json()
    assert body["owner"] == "key:alice"
    today = body["today"]
    assert today["day"] == now.date().isoformat()
    assert (today["turns_done"], today["turns_failed"]) == (2, 0)
    prompt = sum(t.prompt_tokens or 0 for t in laptop)
    cached = sum(t.cached_tokens or 0 for t in laptop)
    assert (today["prompt_tokens"], today["cached_tokens"]) == (prompt, cached)
    assert today["cache_share"] == cached / prompt > 0
    assert today["completion_tokens"] == sum(t.completion_tokens or 0 for t in laptop)
    # Fair use counts per key: only this key's uncached prompt and generated tokens.
    assert today["counted_tokens"] == prompt - cached + today["completion_tokens"]
    assert today["tokens_per_day"] == DAILY

    [day] = body["days"]
    assert (day["day"], day["channel"], day["turns_done"]) == (today["day"], "api", 3)
    assert day["prompt_tokens"] == sum(t.prompt_tokens or 0 for t in everything)
    assert "owner" not in day

    phone = await (await client.get("/v1/usage", headers=auth(second))).json()
    assert phone["today"]["turns_done"] == 1 and phone["days"] == body["days"]
    bobs = await (await client.get("/v1/usage?days=1", headers=auth(bob))).json()
    assert bobs["owner"] == "key:bob" and [d["turns_done"] for d in bobs["days"]] == [1]

    for bad in ("0", "91", "x", "1.5", "-1", "٣"):
        refused = await client.get(f"/v1/usage?days={bad}", headers=auth(first))
        assert refused.status == 400, bad
        assert (await refused.json())["error"] == "bad_request"
    assert (await client.get("/v1/usage")).status == 401
