"""Hostile webhook input: 401/400/429 with a JSON reason, nothing stored, no callback."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient

from bot.channels.webhook.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signed_headers
from bot.http.keys import TURNS
from tests.conftest import MakeClient
from tests.helpers import (
    DEEP,
    HUGE_DIGITS,
    assert_nothing_stored,
    count_rows,
    huge_integer_field,
    nested,
    refusal,
)
from tests.webhook.conftest import SECRET, Receiver, message, post_signed, webhook_settings


async def webhook_client(
    make_client: MakeClient, db_url: str, receiver: Receiver, **sections: Any
) -> TestClient[Any, Any]:
    return await make_client(db_url, webhooks=webhook_settings(receiver), **sections)


async def test_a_5000_digit_webhook_timestamp_is_a_401(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await webhook_client(make_client, sqlite_url, receiver)
    body = json.dumps(message()).encode()
    headers = signed_headers(SECRET, body)
    headers[TIMESTAMP_HEADER] = "9" * HUGE_DIGITS
    headers[SIGNATURE_HEADER] = "v1=" + "0" * 64
    response = await client.post("/webhooks/crm", data=body, headers=headers)
    await refusal(response, 401)
    await assert_nothing_stored(sqlite_url)


async def test_hostile_webhook_bodies_are_400s(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await webhook_client(make_client, sqlite_url, receiver)
    for body in (nested(DEEP, closed=False), huge_integer_field("user_id")):
        await refusal(await post_signed(client, body), 400)
    await assert_nothing_stored(sqlite_url)


async def test_webhook_over_fair_use_is_a_429_with_retry_after(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await webhook_client(
        make_client, sqlite_url, receiver, limits={"messages_per_minute": 1}
    )
    first = await post_signed(client, {**message("m1"), "user_id": "u1"})
    assert first.status == 202
    await client.app[TURNS].wait_idle(timeout=120)
    delivered = len(receiver.attempts)
    before = await count_rows(sqlite_url)

    response = await post_signed(client, {**message("m2"), "user_id": "u1"})
    body = await refusal(response, 429)
    assert body["error"] == "rate_limited"
    assert int(response.headers["Retry-After"]) >= 1
    await client.app[TURNS].wait_idle(timeout=120)
    assert await count_rows(sqlite_url) == before
    assert len(receiver.attempts) == delivered, "a refusal is answered, never called back"
