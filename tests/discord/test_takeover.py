"""A reply taken over by another worker: its sink goes on with the dead worker's messages.

Against the strict fake Discord API. The dead worker's sink says where it stands
(``delivery_of``), the row stores that as JSON, and the sink the next worker opens
(``TurnAddress.delivery``) edits on: every piece of the reply is posted once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bot.channels.discord.channel import DiscordChannel
from bot.channels.discord.render import render
from bot.channels.discord.settings import DiscordBotSettings
from bot.channels.slack.splitting import split
from bot.errors import ErrorClass
from bot.testing.discord_api import FakeDiscordApi
from bot.turns.replies import ReplySink, TurnAddress, delivery_of
from tests.discord.conftest import ask, bot_table

LIMIT = 300
REPLY = "\n\n".join(f"Part {i}: " + "the river runs to the sea " * 3 for i in range(12))
CHANNEL_ID = "1120000000000000777"
USER_MESSAGE = "1120000000000000778"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def interaction(fake: FakeDiscordApi) -> dict[str, Any]:
    body = ask("1220000000000000901", "hi")
    fake.acknowledge(body["token"], body["channel_id"], {"type": 5})
    return {
        "kind": "interaction",
        "token": body["token"],
        "interaction_id": "1220000000000000901",
        "channel_id": body["channel_id"],
        "guild_id": None,
        "received_at": time.time(),
    }


def gateway_message() -> dict[str, Any]:
    return {"kind": "message", "channel_id": CHANNEL_ID, "message_id": USER_MESSAGE}


async def take_over(bot: DiscordChannel, reply_to: dict[str, Any]) -> None:
    """One worker writes the first half of the reply and dies; another writes it all."""
    address = TurnAddress("t1", "c1", "discord:main", reply_to)
    first = bot.open_reply(address)
    await first.start()
    for end in range(90, len(REPLY) // 2, 90):
        await first.delta(REPLY[:end])
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # its last edit is out; nothing more comes from it

    second = reopen(bot, address, first)
    await second.start()
    for end in range(len(REPLY) // 2, len(REPLY), 90):
        await second.delta(REPLY[:end])
        await asyncio.sleep(0.05)
    await second.finish(REPLY)


def reopen(bot: DiscordChannel, address: TurnAddress, dead: ReplySink) -> ReplySink:
    state = delivery_of(dead)
    delivery = json.loads(json.dumps(state))  # as the row stores it
    return bot.open_reply(
        TurnAddress(address.turn_id, "c1", "discord:main", address.reply_to, delivery)
    )


@pytest.mark.parametrize("place", ["interaction", "message"])
async def test_a_reply_taken_over_edits_the_same_messages_and_posts_each_once(
    discord_api: FakeDiscordApi, http: aiohttp.ClientSession, place: str
) -> None:
    bot = DiscordChannel(
        DiscordBotSettings(
            **bot_table(
                discord_api.base_url,
                max_message_chars=LIMIT,
                edit_interval_s=0.05,
                post_interval_s=0.05,
            )
        ),
        http,
    )
    pieces = [render(piece) for piece in split(REPLY, LIMIT)]
    assert len(pieces) >= 4
    if place == "interaction":
        reply_to = interaction(discord_api)
        await take_over(bot, reply_to)
        assert discord_api.interaction_messages(reply_to["token"]) == pieces
        assert len(discord_api.calls_on("POST /webhooks/{id}/{token}")) == len(pieces) - 1
    else:
        await take_over(bot, gateway_message())
        messages = discord_api.channel_messages(CHANNEL_ID)
        assert [m.content for m in messages] == pieces
        # Only the first message answers the user's.
        assert [m.reference for m in messages] == [USER_MESSAGE] + [None] * (len(pieces) - 1)
        assert len(discord_api.calls_on("POST /channels/{id}/messages")) == len(pieces)
    assert discord_api.violations == [] and discord_api.rejected == []


async def test_an_apology_after_a_takeover_leaves_the_text_already_shown(
    discord_api: FakeDiscordApi, http: aiohttp.ClientSession
) -> None:
    """The reply fails on the worker that took it over: the apology goes in a follow-up,
    never over the part of the reply the user already has in ``@original``."""
    bot = DiscordChannel(
        DiscordBotSettings(**bot_table(discord_api.base_url, edit_interval_s=0.05)), http
    )
    reply_to = interaction(discord_api)
    address = TurnAddress("t1", "c1", "discord:main", reply_to)
    first = bot.open_reply(address)
    await first.start()
    await first.delta("The river runs")
    await asyncio.sleep(0.5)

    second = reopen(bot, address, first)
    await second.start()
    await second.fail(ErrorClass.ENGINE_UNAVAILABLE, "Sorry, that failed.")
    assert discord_api.interaction_messages(reply_to["token"]) == [
        "The river runs",
        "*Sorry, that failed.*",
    ]
