"""The webhook reply sink against a recording receiver on loopback, through the real client."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import aiohttp

from bot.channels.base import TurnAddress
from bot.channels.webhook.channel import WebhookChannel
from bot.channels.webhook.settings import WebhookSettings
from bot.errors import ErrorClass
from bot.turns.replies import delivery_of
from tests.webhook.conftest import Receiver, webhook_settings

ADDRESS = TurnAddress(
    turn_id="turn-1",
    conversation_id="conv-1",
    channel="webhook:crm",
    reply_to={"conversation_id": "c1", "message_id": "m1"},
)


async def test_a_stop_lets_the_callback_in_flight_land_and_numbers_on_after_it(
    receiver: Receiver,
) -> None:
    # Cut off mid-POST, a chunk may or may not reach the receiver: the one in flight
    # completes, is delivered once, and the error callback takes the next seq.
    receiver.delay_s = 0.5
    [settings] = webhook_settings(receiver)
    async with aiohttp.ClientSession() as http:
        sink = WebhookChannel(WebhookSettings(**settings), http).open_reply(ADDRESS)
        await sink.start()
        await sink.delta("Hello")
        await asyncio.wait_for(receiver.arrived_one.wait(), 10)  # the chunk is in flight
        await sink.fail(ErrorClass.CANCELLED, "Stopped.")
    assert [(c.document["type"], c.document["seq"]) for c in receiver.attempts] == [
        ("chunk", 0),
        ("error", 1),
    ]
    assert receiver.delivered[0]["text"] == "Hello"
    assert {c.status for c in receiver.attempts} == {200}


async def test_a_reply_taken_over_sends_the_rest_at_its_offset_numbered_on(
    receiver: Receiver,
) -> None:
    """A worker died after two chunks: the one that takes the turn over sends only what
    follows them, at the right offset, and numbers its callbacks on."""
    [settings] = webhook_settings(receiver)
    async with aiohttp.ClientSession() as http:
        channel = WebhookChannel(WebhookSettings(**settings), http)
        first = channel.open_reply(ADDRESS)
        await first.start()
        await first.delta("Hello")
        await asyncio.wait_for(receiver.arrived_one.wait(), 10)
        await asyncio.sleep(0.3)
        state = delivery_of(first)
        assert state is not None

        second = channel.open_reply(replace(ADDRESS, delivery=json.loads(json.dumps(state))))
        await second.start()
        await second.delta("Hello, wor")
        await second.finish("Hello, world!")
    documents = [c.document for c in receiver.attempts]
    chunks = [(d["seq"], d["offset"], d["text"]) for d in documents if d["type"] == "chunk"]
    assert "".join(text for _, _, text in chunks) == "Hello, world!"
    given = 0
    for _, offset, text in chunks:
        assert offset == given, chunks
        given += len(text)
    seqs = [d["seq"] for d in documents]
    assert seqs == list(range(len(seqs)))
    assert documents[-1]["type"] == "final" and documents[-1]["text"] == "Hello, world!"
