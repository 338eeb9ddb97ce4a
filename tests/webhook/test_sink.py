"""The webhook reply sink against a recording receiver on loopback, through the real client."""

from __future__ import annotations

import asyncio

import aiohttp

from bot.channels.base import TurnAddress
from bot.channels.webhook.channel import WebhookChannel
from bot.channels.webhook.settings import WebhookSettings
from bot.errors import ErrorClass
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
