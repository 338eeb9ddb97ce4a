"""The outbound side alone, against the fake API: the sink, the 15 minutes, the doctor, the CLI."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from bot.channels.discord.channel import DiscordChannel
from bot.channels.discord.deliveries import InteractionDelivery, InteractionTarget
from bot.channels.discord.doctor import check
from bot.channels.discord.settings import DiscordBotSettings
from bot.channels.discord.sink import DiscordReplySink
from bot.cli import main
from bot.errors import DeliveryError, DoctorFailure, ErrorClass
from bot.testing.discord_api import FakeDiscordApi
from bot.turns.replies import TurnAddress
from tests.discord.conftest import APPLICATION_ID, ask, bot_table

EDIT_ROUTE = "PATCH /webhooks/{id}/{token}/messages/{id}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def channel(fake: FakeDiscordApi, http: aiohttp.ClientSession, **overrides: Any) -> DiscordChannel:
    return DiscordChannel(DiscordBotSettings(**bot_table(fake.base_url, **overrides)), http)


def deferred(fake: FakeDiscordApi, interaction_id: str) -> dict[str, Any]:
    body = ask(interaction_id, "hi")
    fake.acknowledge(body["token"], body["channel_id"], {"type": 5})
    return {
        "kind": "interaction",
        "token": body["token"],
        "interaction_id": interaction_id,
        "channel_id": body["channel_id"],
        "guild_id": None,
        "received_at": time.time(),
    }


async def test_no_call_is_made_with_a_token_past_its_15_minutes(
    discord_api: FakeDiscordApi, http: aiohttp.ClientSession
) -> None:
    bot = channel(discord_api, http)
    reply_to = deferred(discord_api, "1220000000000000401")
    target = InteractionTarget(APPLICATION_ID, reply_to["token"], reply_to["channel_id"], 0.0)
    late = InteractionDelivery(bot.api, target, clock=lambda: 15 * 60.0)
    sink = DiscordReplySink(late, max_retry_wait_s=5, turn_id="t1")
    with pytest.raises(DeliveryError, match="expired"):
        await sink.finish("too late")
    await sink.fail(ErrorClass.DELIVERY, "Sorry")
    assert discord_api.calls == []


async def test_a_5xx_is_retried_and_a_429_waited_for_the_same_edit(
    discord_api: FakeDiscordApi, http: aiohttp.ClientSession
) -> None:
    bot = channel(discord_api, http)
    reply_to = deferred(discord_api, "1220000000000000402")
    discord_api.fail_next(EDIT_ROUTE, 502)
    discord_api.rate_limit_next(EDIT_ROUTE, retry_after=0.5)
    sink = bot.open_reply(TurnAddress("t2", "c", "discord:main", reply_to))
    started = time.monotonic()
    await sink.finish("**the answer**")
    assert time.monotonic() - started >= 0.5
    assert discord_api.interaction_messages(reply_to["token"]) == ["**the answer**"]
    assert [call.status for call in discord_api.calls_on(EDIT_ROUTE)] == [502, 429, 200]
    assert discord_api.violations == []


async def test_an_emptied_bucket_is_waited_out_before_the_next_call(
    discord_api: FakeDiscordApi, http: aiohttp.ClientSession
) -> None:
    # Two calls a second in this bucket: the headers say "0 remaining, resets in ..."
    discord_api.limit, discord_api.window_s = 2, 1.0
    bot = channel(discord_api, http, edit_interval_s=0)
    reply_to = deferred(discord_api, "1220000000000000403")
    target = InteractionTarget(
        APPLICATION_ID, reply_to["token"], reply_to["channel_id"], time.time()
    )
    delivery = InteractionDelivery(bot.api, target)
    for text in ("one", "one two", "one two three", "one two three four"):
        await delivery.push(text, final=True)
    assert discord_api.violations == [] and discord_api.rejected == []
    edits = discord_api.calls_on(EDIT_ROUTE)
    assert len(edits) == 4 and edits[2].at - edits[0].at >= 0.9


async def test_doctor_checks_the_token_the_public_key_and_the_endpoint(
    discord_api: FakeDiscordApi, http: aiohttp.ClientSession
) -> None:
    settings = DiscordBotSettings(**bot_table(discord_api.base_url))
    discord_api.interactions_endpoint_url = "https://bot.example.com/discord/main"
    line = await check(http, settings, "https://bot.example.com")
    assert "public key matches" in line
    wrong_key = DiscordBotSettings(**bot_table(discord_api.base_url, public_key="ab" * 32))
    with pytest.raises(DoctorFailure, match="public_key"):
        await check(http, wrong_key, None)
    wrong_token = DiscordBotSettings(**bot_table(discord_api.base_url, token="nope"))
    with pytest.raises(DoctorFailure) as failure:
        await check(http, wrong_token, None)
    assert failure.value.error_class == "auth" and "nope" not in failure.value.message
    discord_api.interactions_endpoint_url = None
    with pytest.raises(DoctorFailure, match="Endpoint URL is not set"):
        await check(http, settings, None)


def test_register_commands_overwrites_the_application_commands(
    discord_api: FakeDiscordApi, tmp_path: Any
) -> None:
    config = tmp_path / "bot.toml"
    table = bot_table(discord_api.base_url)
    config.write_text(
        "[[discord]]\n"
        + "".join(f'{key} = "{value}"\n' for key, value in table.items() if isinstance(value, str))
    )
    # The fake runs on the test's loop; the CLI runs its own: serve it from a thread.
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    fake = FakeDiscordApi(
        token=discord_api.token,
        application_id=APPLICATION_ID,
        public_key=discord_api.public_key,
        bot_user_id=discord_api.bot_user_id,
    )
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(fake.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        config.write_text(config.read_text().replace(discord_api.base_url, fake.base_url))
        result = CliRunner().invoke(
            main, ["--config", str(config), "discord", "register-commands", "main"]
        )
        assert result.exit_code == 0, result.output
        assert "/ask" in result.output
        assert [c["name"] for c in fake.commands] == ["ask", "new", "stop", "stats", "help"]
        unknown = CliRunner().invoke(
            main, ["--config", str(config), "discord", "register-commands", "other"]
        )
        assert unknown.exit_code != 0 and "no [[discord]] bot named" in unknown.output
    finally:
        asyncio.run_coroutine_threadsafe(fake.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def test_an_edit_before_discord_read_the_deferred_response_is_tried_again(
    discord_api: FakeDiscordApi, http: aiohttp.ClientSession
) -> None:
    # The turn can start before Discord has read the handler's "type 5": its webhook is
    # unknown there for a moment (404, code 10015). The reply must still arrive.
    bot = channel(discord_api, http)
    body = ask("1220000000000000404", "hi")
    reply_to = {
        "kind": "interaction",
        "token": body["token"],
        "channel_id": body["channel_id"],
        "received_at": time.time(),
    }
    sink = bot.open_reply(TurnAddress("t4", "c", "discord:main", reply_to))
    finishing = asyncio.create_task(sink.finish("the answer"))
    await asyncio.sleep(0.4)
    discord_api.acknowledge(body["token"], body["channel_id"], {"type": 5})
    await asyncio.wait_for(finishing, 10)
    assert discord_api.interaction_messages(body["token"]) == ["the answer"]
    assert discord_api.calls_on(EDIT_ROUTE)[0].status == 404
