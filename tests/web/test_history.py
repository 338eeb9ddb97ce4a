"""The page's server side: the page itself, and the conversation read it restores from."""

from __future__ import annotations

from tests.conftest import MakeClient, issue_key
from tests.helpers import auth, read_sse


async def test_page_is_served_with_a_strict_content_security_policy(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    page = await client.get("/")
    assert page.status == 200
    assert '<script type="module" src="/static/app.js">' in await page.text()
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["Referrer-Policy"] == "no-referrer"
    for name in ("app.js", "api.js", "timing.js", "errors.js", "style.css"):
        assert (await client.get(f"/static/{name}")).status == 200, name


async def test_conversation_turns_are_listed_for_their_owner_only(
    db_url: str, make_client: MakeClient
) -> None:
    client = await make_client(db_url)
    alice = await issue_key(db_url, "alice")
    mallory = await issue_key(db_url, "mallory")
    for i, text in enumerate(["First", "Second"]):
        body = {"conversation_id": "c1", "message_id": f"m{i}", "text": text}
        accepted = await (await client.post("/v1/messages", json=body, headers=auth(alice))).json()
        await read_sse(await client.get(accepted["stream_url"], headers=auth(alice)))

    listed = await (await client.get("/v1/conversations/c1/turns", headers=auth(alice))).json()
    assert listed["owner"] == "key:alice"
    assert [turn["text"] for turn in listed["turns"]] == ["First", "Second"]
    second = listed["turns"][1]
    assert second["status"] == "done" and second["reply"]
    usage = second["usage"]
    assert usage["new_tokens"] == usage["prompt_tokens"] - usage["cached_tokens"]
    assert usage["cached_tokens"] > 0  # turn 2 starts with turn 1's prompt and reply
    assert {"prefill", "decode", "ttft", "e2e"} <= set(second["timings_ms"])

    # The same conversation id under another key is another (empty) conversation.
    other = await (await client.get("/v1/conversations/c1/turns", headers=auth(mallory))).json()
    assert other["turns"] == []
    assert (await client.get("/v1/conversations/c1/turns")).status == 401
