"""Webhook messages that name no user count against their conversation's fair use."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from bot.http.keys import TURNS
from tests.conftest import MakeClient
from tests.helpers import count_rows, refusal
from tests.ops.helpers import botctl
from tests.webhook.conftest import Receiver, message, post_signed, webhook_settings


async def _client(
    make_client: MakeClient, db_url: str, receiver: Receiver, **limits: int
) -> TestClient[Any, Any]:
    return await make_client(db_url, webhooks=webhook_settings(receiver), limits=limits)


async def test_messages_without_a_user_are_limited_per_conversation(
    db_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await _client(make_client, db_url, receiver, messages_per_minute=2)
    for message_id in ("m1", "m2"):
        response = await post_signed(client, message(message_id, conversation="c1"))
        assert response.status == 202, await response.text()
    await client.app[TURNS].wait_idle(timeout=120)
    before = await count_rows(db_url)

    over = await post_signed(client, message("m3", conversation="c1"))
    body = await refusal(over, 429)
    assert body["error"] == "rate_limited" and int(over.headers["Retry-After"]) >= 1
    assert await count_rows(db_url) == before, "a refused message is not stored"

    # Another conversation has its own allowance; a redelivery is still a duplicate.
    other = await post_signed(client, message("m4", conversation="c2"))
    assert other.status == 202
    again = await post_signed(client, message("m1", conversation="c1"))
    assert again.status == 202 and (await again.json())["duplicate"] is True
    await client.app[TURNS].wait_idle(timeout=120)


async def test_their_tokens_are_charged_to_the_conversation(
    db_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await _client(make_client, db_url, receiver, tokens_per_day=1)
    first = await post_signed(client, message("m1", conversation="c1"))
    assert first.status == 202
    await client.app[TURNS].wait_idle(timeout=120)

    spent = await post_signed(client, message("m2", conversation="c1"))
    body = await refusal(spent, 429)
    assert body["limit"] == "tokens_per_day"
    fresh = await post_signed(client, message("m3", conversation="c2"))
    assert fresh.status == 202
    await client.app[TURNS].wait_idle(timeout=120)

    shown = await botctl(
        "limits", "show", "--conversation", "webhook:crm:c1", "--json",
        env={"BOT_DATABASE__URL": db_url, "BOT_CONFIG": ""},
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert '"subject": "conversation:webhook:crm:c1"' in shown.stdout
    assert '"tokens_used_today": 0' not in shown.stdout
