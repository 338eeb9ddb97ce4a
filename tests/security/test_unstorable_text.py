"""U+0000 and lone surrogates never reach a statement, on any channel, in text or in ids.

JSON lets any client send ``\\u0000`` and ``\\ud800``; PostgreSQL's ``text``
refuses the first in any statement and no UTF-8 column holds the second. Text
is stored with U+FFFD in their place; an id (a path id, a conversation id,
``previous_response_id``) is refused with a 400, and nothing is stored for it.
Sent as raw JSON escapes, as a client would.
"""

from __future__ import annotations

import json
from typing import Any

from bot.http.keys import TURNS
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from tests.conftest import MakeClient, issue_key
from tests.helpers import assert_nothing_stored, auth, load_turns
from tests.openai.helpers import DEMO_MODEL
from tests.slack.conftest import mention, post_event, slack_section
from tests.telegram.conftest import HEADER as TELEGRAM_HEADER
from tests.telegram.conftest import SECRET as TELEGRAM_SECRET
from tests.telegram.conftest import bot_table, private_update
from tests.webhook.conftest import Receiver, post_signed, webhook_settings

UNSTORABLE = "a\u0000b\ud800c"
STORED = "a\ufffdb\ufffdc"


def raw(document: dict[str, Any]) -> bytes:
    """JSON with escapes (ensure_ascii), as a client sends ``\\u0000`` and ``\\ud800``."""
    return json.dumps(document).encode()


async def test_ids_no_row_can_hold_are_refused_before_any_statement(
    db_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await make_client(db_url, webhooks=webhook_settings(receiver))
    key = auth(await issue_key(db_url))
    json_headers = {**key, "Content-Type": "application/json"}
    for field in ("conversation_id", "message_id", "user_id"):
        body = {"conversation_id": "c1", "message_id": "m1", "text": "hi", field: UNSTORABLE}
        response = await client.post("/v1/messages", data=raw(body), headers=json_headers)
        assert response.status == 400, (field, await response.text())
        assert field in (await response.json())["reason"]
    for path in (
        "/v1/turns/%00",
        "/v1/turns/a%00b/events",
        "/v1/conversations/c%00/turns",
        "/v1/turns/%00/regenerate",
    ):
        method = "POST" if path.endswith("regenerate") else "GET"
        response = await client.request(method, path, headers=key)
        assert response.status == 400, (path, await response.text())
    # OpenAI's routes say so in OpenAI's shape.
    response = await client.get("/v1/responses/resp_%00", headers=key)
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "bad_request"
    response = await client.post(
        "/v1/responses",
        data=raw({"model": DEMO_MODEL, "input": "hi", "previous_response_id": "resp_\u0000"}),
        headers=json_headers,
    )
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "previous_response_id"
    webhook = await post_signed(
        client, raw({"conversation_id": UNSTORABLE, "message_id": "m1", "text": "hi"})
    )
    assert webhook.status == 400
    await assert_nothing_stored(db_url)


async def test_text_with_them_is_stored_with_the_replacement_character(
    db_url: str,
    make_client: MakeClient,
    receiver: Receiver,
    fake_telegram: FakeTelegram,
    slack_api: FakeSlackApi,
) -> None:
    client = await make_client(
        db_url,
        webhooks=webhook_settings(receiver),
        telegram=[bot_table(fake_telegram)],
        slack=slack_section(slack_api.base_url),
    )
    key = auth(await issue_key(db_url))
    json_headers = {**key, "Content-Type": "application/json"}
    api = await client.post(
        "/v1/messages",
        data=raw({"conversation_id": "c1", "message_id": "m1", "text": UNSTORABLE}),
        headers=json_headers,
    )
    assert api.status == 202, await api.text()
    chat = await client.post(
        "/v1/chat/completions",
        data=raw(
            {
                "model": DEMO_MODEL,
                "user": UNSTORABLE,
                "messages": [
                    {"role": "system", "content": UNSTORABLE},
                    {"role": "user", "content": [{"type": "text", "text": UNSTORABLE}]},
                    {"role": "assistant", "content": UNSTORABLE},
                    {"role": "user", "content": UNSTORABLE},
                ],
            }
        ),
        headers=json_headers,
    )
    assert chat.status == 200, await chat.text()
    response = await client.post(
        "/v1/responses",
        data=raw({"model": DEMO_MODEL, "input": UNSTORABLE, "instructions": UNSTORABLE}),
        headers=json_headers,
    )
    assert response.status == 200, await response.text()
    webhook = await post_signed(
        client, raw({"conversation_id": "c1", "message_id": "w1", "text": UNSTORABLE})
    )
    assert webhook.status == 202, await webhook.text()
    telegram = await client.post(
        "/telegram/testbot",
        data=raw(private_update(UNSTORABLE)),
        headers={TELEGRAM_HEADER: TELEGRAM_SECRET, "Content-Type": "application/json"},
    )
    assert telegram.status == 200
    event = mention("Ev0NUL", "1700000000.000100")
    event["event"]["text"] = f"<@{event['authorizations'][0]['user_id']}> {UNSTORABLE}"
    status, _, _ = await post_event(client, event)
    assert status == 200
    await client.app[TURNS].wait_idle(timeout=120)
    turns = await load_turns(db_url)
    assert {turn.channel.split(":")[0] for turn in turns} == {
        "api",
        "openai",
        "webhook",
        "telegram",
        "slack",
    }
    for turn in turns:
        assert STORED in turn.user_text, (turn.channel, turn.user_text)
        assert "\u0000" not in turn.user_text
    (chat_turn,) = [t for t in turns if t.channel == "openai" and t.user_id is not None]
    assert chat_turn.user_id == STORED
