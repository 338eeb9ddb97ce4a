"""The generic webhook end to end: real app and engine on loopback, a recording receiver."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bot.channels.webhook.settings import WebhookSettings
from bot.channels.webhook.signing import verify
from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from tests.conftest import MakeClient
from tests.engines import SlowEngine
from tests.helpers import count_rows, load_turns
from tests.webhook.conftest import SECRET, Receiver, message, post_signed, webhook_settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "webhook.md"


async def _idle(client: Any) -> None:
    await client.app[TURNS].wait_idle(timeout=30)


def _assert_in_order_reply(callbacks: list[dict[str, Any]], turn_id: str) -> dict[str, Any]:
    """Chunks with seq 0..n-1 and contiguous offsets, then one final whose text they add up to."""
    mine = [c for c in callbacks if c["turn_id"] == turn_id]
    assert [c["seq"] for c in mine] == list(range(len(mine)))
    *chunks, final = mine
    assert chunks and all(c["type"] == "chunk" for c in chunks)
    assert final["type"] == "final"
    offset = 0
    for chunk in chunks:
        assert chunk["offset"] == offset
        offset += len(chunk["text"])
    assert "".join(c["text"] for c in chunks) == final["text"] != ""
    return final


async def test_signed_message_is_answered_with_signed_ordered_chunks_then_final(
    db_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await make_client(db_url, webhooks=webhook_settings(receiver))
    response = await post_signed(client, message(), now=time.time())
    assert response.status == 202
    body = await response.json()
    assert body["duplicate"] is False
    await _idle(client)

    final = _assert_in_order_reply(receiver.delivered, body["turn_id"])
    assert final["conversation_id"] == "c1" and final["in_reply_to"] == "m1"
    assert final["webhook"] == "crm"
    usage = final["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["new_tokens"] == usage["prompt_tokens"] - usage["cached_tokens"]
    for callback in receiver.attempts:
        headers = callback.headers
        assert (
            verify(
                SECRET,
                headers["X-Webhook-Timestamp"],
                headers["X-Webhook-Signature"],
                callback.body,
            )
            is None
        )
        assert headers["X-Webhook-Delivery"] == f"{body['turn_id']}.{callback.document['seq']}"

    (turn,) = await load_turns(db_url)
    assert turn.status == "done" and turn.channel == "webhook:crm"
    assert turn.reply_text == final["text"]
    assert turn.completion_tokens == usage["completion_tokens"]


async def test_bad_or_stale_signatures_are_refused_and_nothing_is_stored(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver))
    now = time.time()
    refused = [
        await post_signed(client, message(), secret="not-the-secret-at-all"),
        # A minute outside the 300 s window each way: a slow machine cannot bring it back in.
        await post_signed(client, message(), now=now - 360),  # replayed after the window
        await post_signed(client, message(), now=now + 360),
        await client.post("/webhooks/crm", json=message()),  # unsigned
    ]
    assert [r.status for r in refused] == [401, 401, 401, 401]
    assert [(await r.json())["error"] for r in refused] == ["auth"] * 4

    # A valid signature over other bytes than the ones sent.
    from bot.channels.webhook.signing import signed_headers

    headers = signed_headers(SECRET, b'{"conversation_id":"c1","message_id":"m1","text":"x"}')
    tampered = await client.post("/webhooks/crm", json=message(text="evil"), headers=headers)
    assert tampered.status == 401

    assert (await post_signed(client, message(), name="nope")).status == 404
    malformed = await post_signed(client, {"conversation_id": "c1", "text": "no id"})
    assert malformed.status == 400 and "message_id" in (await malformed.json())["reason"]
    assert (await post_signed(client, b"[not json")).status == 400
    assert (await count_rows(sqlite_url)) == {
        "conversations": 0,
        "turns": 0,
        "inbound_events": 0,
        "messages": 0,
    }
    assert receiver.attempts == []

    # Just inside the window is fine.
    assert (await post_signed(client, message(), now=now - 290)).status == 202
    await _idle(client)


async def test_redelivered_message_is_acknowledged_once_and_answered_once(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver))
    first = await (await post_signed(client, message("m1"))).json()
    again = await post_signed(client, message("m1"), now=time.time() + 1)  # re-signed retry
    assert again.status == 202
    second = await again.json()
    assert second == {"turn_id": first["turn_id"], "duplicate": True}
    await _idle(client)
    finals = [c for c in receiver.delivered if c["type"] == "final"]
    assert len(finals) == 1
    assert (await count_rows(sqlite_url))["turns"] == 1


async def test_a_message_id_reused_for_another_message_is_a_conflict(
    db_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await make_client(db_url, webhooks=webhook_settings(receiver))
    first = await (await post_signed(client, message("m1", "c1", "Hello!"))).json()

    other_text = await post_signed(client, message("m1", "c1", "Goodbye!"))
    assert other_text.status == 409
    refusal = await other_text.json()
    assert refusal["error"] == "conflict" and "another text" in refusal["reason"]
    assert refusal["turn_id"] == first["turn_id"]

    other_conversation = await post_signed(client, message("m1", "c2", "Hello!"))
    assert other_conversation.status == 409
    assert "another conversation" in (await other_conversation.json())["reason"]

    await _idle(client)
    assert len([c for c in receiver.delivered if c["type"] == "final"]) == 1
    counts = await count_rows(db_url)
    assert counts["turns"] == 1 and counts["inbound_events"] == 1 and counts["conversations"] == 1


async def test_messages_of_one_conversation_are_answered_in_order(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    # A slow receiver: text piles up while a callback is in flight and is merged, never reordered.
    receiver.delay_s = 0.01
    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver))
    turn_ids = [
        (await (await post_signed(client, message(f"m{i}", text=f"Question {i}?"))).json())[
            "turn_id"
        ]
        for i in range(3)
    ]
    await _idle(client)
    assert receiver.max_in_flight == 1
    finals = [c for c in receiver.delivered if c["type"] == "final"]
    assert [c["turn_id"] for c in finals] == turn_ids
    for turn_id in turn_ids:
        _assert_in_order_reply(receiver.delivered, turn_id)


async def test_callbacks_are_retried_while_the_receiver_fails_for_a_while(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver))
    receiver.fail_statuses = [503, 502, 429]
    receiver.fail_for_s = 1.0  # then down for a while
    body = await (await post_signed(client, message())).json()
    await _idle(client)

    failed = [c for c in receiver.attempts if c.status >= 400]
    assert len(failed) >= 4
    # Each retry re-sends the same delivery, freshly signed.
    first = failed[0]
    delivery = first.headers["X-Webhook-Delivery"]
    retries = [c for c in receiver.attempts if c.headers["X-Webhook-Delivery"] == delivery]
    assert len(retries) >= 2 and retries[-1].status == 200
    assert len({c.body for c in retries}) == 1
    _assert_in_order_reply(receiver.delivered, body["turn_id"])
    (turn,) = await load_turns(sqlite_url)
    assert turn.status == "done"


async def test_receiver_down_for_too_long_fails_the_turn_as_delivery(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    receiver.always_fail = 503
    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver, retry_for_s=0.5))
    started = time.monotonic()
    await post_signed(client, message())
    await _idle(client)
    elapsed = time.monotonic() - started

    (turn,) = await load_turns(sqlite_url)
    assert turn.status == "failed" and turn.error_class == "delivery"
    assert elapsed < 5
    # Bounded: waits of 0.05, 0.1, 0.2, then the rest of 0.5 s; no error callback after that.
    assert 3 <= len(receiver.attempts) <= 8
    assert {c.document["seq"] for c in receiver.attempts} == {0}


async def test_a_refusing_receiver_is_not_retried(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    receiver.always_fail = 400
    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver))
    await post_signed(client, message())
    await _idle(client)
    assert len(receiver.attempts) == 1
    (turn,) = await load_turns(sqlite_url)
    assert turn.error_class == "delivery"


async def test_the_documented_verification_snippet_accepts_our_callbacks(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    section = DOCS.read_text().split("## Verifying a callback", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None
    namespace: dict[str, Any] = {}
    exec(snippet.group(1), namespace)
    verify_callback = namespace["verify_callback"]

    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver))
    await post_signed(client, message())
    await _idle(client)
    assert receiver.attempts
    for callback in receiver.attempts:
        assert verify_callback(SECRET, callback.headers, callback.body)
        assert not verify_callback(SECRET, callback.headers, callback.body + b" ")
        assert not verify_callback("wrong-secret-wrong-secret", callback.headers, callback.body)


async def test_a_stopped_turn_ends_with_an_error_callback_after_its_chunks(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver, engine: LocalVLLMEngine
) -> None:
    slow = SlowEngine(engine, 0.05)
    client = await make_client(
        sqlite_url,
        engine_override=slow,
        webhooks=webhook_settings(receiver),
        generation={"max_tokens": 200},
    )
    body = await (await post_signed(client, message())).json()
    await asyncio.wait_for(receiver.accepted_one.wait(), 20)  # streaming has begun
    assert await client.app[TURNS].cancel_turn(body["turn_id"])
    await _idle(client)

    *chunks, last = receiver.delivered
    assert chunks and {c["type"] for c in chunks} == {"chunk"}
    assert last["type"] == "error" and last["error_class"] == "cancelled"
    assert last["seq"] >= len(chunks)  # after every chunk, the one in flight at the stop too
    assert [c["seq"] for c in chunks] == list(range(len(chunks)))


async def test_a_rotated_secret_accepts_both_secrets_inbound_and_signs_with_the_new_one(
    sqlite_url: str, make_client: MakeClient, receiver: Receiver
) -> None:
    new_secret = "rotated-secret-fedcba9876543210"
    settings = webhook_settings(receiver, secret=new_secret, previous_secrets=[SECRET])
    client = await make_client(sqlite_url, webhooks=settings)
    # The sender still on the old secret, then switched to the new one; anything else is refused.
    assert (await post_signed(client, message("m1"), secret=SECRET)).status == 202
    assert (await post_signed(client, message("m2"), secret=new_secret)).status == 202
    assert (await post_signed(client, message("m3"), secret="x" * 32)).status == 401
    await _idle(client)

    assert len(await load_turns(sqlite_url)) == 2
    callbacks = [c for c in receiver.attempts if 200 <= c.status < 300]
    assert callbacks
    for callback in callbacks:
        timestamp = callback.headers["X-Webhook-Timestamp"]
        signature_header = callback.headers["X-Webhook-Signature"]
        assert verify(new_secret, timestamp, signature_header, callback.body) is None
        assert verify(SECRET, timestamp, signature_header, callback.body) is not None


def test_previous_secrets_must_be_long_enough_too() -> None:
    with pytest.raises(ValidationError, match="at least 16 characters"):
        WebhookSettings(
            name="crm",
            secret="x" * 32,
            previous_secrets=["short"],
            callback_url="https://crm.example.com/hook",
        )
