"""The gateway path: hikari's GatewayBot against a fake gateway on loopback.

The fake speaks Discord's gateway protocol over a real WebSocket (hello,
identify, heartbeats, dispatches, resume with replay); the service connects to
it through the address the fake HTTP API's ``GET /gateway/bot`` gives, as it
would to Discord. A mention and a DM are each answered once, by a message in
reply that is edited as the reply streams; after a dropped connection the
library resumes and a message sent meanwhile is answered once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient

from bot.channels.access import GROUPS_OFF_TEXT
from bot.channels.discord.gateway import GATEWAYS
from bot.testing.discord_api import FakeDiscordApi
from bot.testing.discord_gateway import FakeDiscordGateway
from tests.conftest import MakeClient
from tests.discord.conftest import BOT_USER_ID, discord_section, idle, load_fixture
from tests.helpers import count_rows, load_turns, wait_until

CONNECT_TIMEOUT_S = 30.0


def mention(message_id: str, text: str = "what is a token?") -> dict[str, Any]:
    payload = load_fixture("message_create_mention")
    payload["id"] = message_id
    payload["content"] = f"<@{BOT_USER_ID}> {text}"
    return payload


def dm(message_id: str, text: str = "hi, can you help me?") -> dict[str, Any]:
    payload = load_fixture("message_create_dm")
    payload["id"] = message_id
    payload["content"] = text
    return payload


async def connected(client: TestClient[Any, Any], gateway: FakeDiscordGateway) -> None:
    holder = client.server.app[GATEWAYS]["main"]
    await asyncio.wait_for(holder.connected.wait(), CONNECT_TIMEOUT_S)
    await asyncio.wait_for(gateway.connected.wait(), CONNECT_TIMEOUT_S)


async def test_a_mention_and_a_dm_are_answered_once_each(
    discord_api: FakeDiscordApi,
    discord_gateway: FakeDiscordGateway,
    make_client: MakeClient,
    db_url: str,
) -> None:
    client = await make_client(db_url, discord=discord_section(discord_api.base_url, gateway=True))
    await connected(client, discord_gateway)
    assert len(discord_gateway.identifies) == 1
    # Mentions and DMs carry their text without the privileged Message Content intent.
    assert discord_gateway.identifies[0]["intents"] & (1 << 15) == 0

    await discord_gateway.dispatch("MESSAGE_CREATE", mention("1230000000000000011"))
    await discord_gateway.dispatch("MESSAGE_CREATE", dm("1230000000000000012"))
    # Chatter in a server channel that does not mention the bot: not answered, not stored.
    chatter = mention("1230000000000000013")
    chatter["content"], chatter["mentions"] = "just chatting", []
    await discord_gateway.dispatch("MESSAGE_CREATE", chatter)
    await wait_until(lambda: len(discord_api.calls) >= 2, 30)
    await idle(client)

    turns = {turn.user_text: turn for turn in await load_turns(db_url)}
    assert set(turns) == {"what is a token?", "hi, can you help me?"}
    assert all(turn.status == "done" for turn in turns.values())
    for channel_id, message_id, text in (
        ("1110000000000000002", "1230000000000000011", "what is a token?"),
        ("1120000000000000002", "1230000000000000012", "hi, can you help me?"),
    ):
        [reply] = discord_api.channel_messages(channel_id)
        assert reply.reference == message_id
        assert reply.content.strip() == (turns[text].reply_text or "").strip() or (
            not turns[text].reply_text
        )
    assert turns["what is a token?"].user_name == "Alice"
    # Every layer of the turn's log line is timed, the gateway's own wait included.
    assert {"ingress", "auth", "persist"} <= set(turns["what is a token?"].layer_ms)
    assert discord_api.violations == [] and discord_api.pings == []


async def test_after_a_dropped_connection_the_session_resumes_and_nothing_is_lost(
    discord_api: FakeDiscordApi,
    discord_gateway: FakeDiscordGateway,
    make_client: MakeClient,
    sqlite_url: str,
) -> None:
    client = await make_client(
        sqlite_url, discord=discord_section(discord_api.base_url, gateway=True)
    )
    await connected(client, discord_gateway)
    await discord_gateway.dispatch("MESSAGE_CREATE", dm("1230000000000000021", "first"))
    await wait_until(lambda: len(discord_api.calls) >= 1, 30)
    await discord_gateway.drop()
    # Sent while the client is away: Discord keeps it for the session's resume.
    await discord_gateway.dispatch("MESSAGE_CREATE", dm("1230000000000000022", "second"))
    await asyncio.wait_for(discord_gateway.connected.wait(), CONNECT_TIMEOUT_S)
    await wait_until(lambda: len(discord_api.channel_messages("1120000000000000002")) >= 2, 30)
    await idle(client)

    assert len(discord_gateway.identifies) == 1 and len(discord_gateway.resumes) == 1
    turns = await load_turns(sqlite_url)
    assert [turn.user_text for turn in turns] == ["first", "second"]
    assert len({turn.conversation_id for turn in turns}) == 1  # one DM, one conversation
    replies = discord_api.channel_messages("1120000000000000002")
    assert [reply.reference for reply in replies] == ["1230000000000000021", "1230000000000000022"]
    assert (await count_rows(sqlite_url))["inbound_events"] == 2


async def test_group_policy_off_declines_a_mention_in_the_chat_and_stores_nothing(
    discord_api: FakeDiscordApi,
    discord_gateway: FakeDiscordGateway,
    make_client: MakeClient,
    db_url: str,
) -> None:
    client = await make_client(
        db_url, discord=discord_section(discord_api.base_url, gateway=True, groups="off")
    )
    await connected(client, discord_gateway)
    await discord_gateway.dispatch("MESSAGE_CREATE", mention("1230000000000000041"))
    await wait_until(lambda: bool(discord_api.channel_messages("1110000000000000002")), 30)
    await idle(client)
    [notice] = discord_api.channel_messages("1110000000000000002")
    assert notice.content == f"*{GROUPS_OFF_TEXT}*" and notice.reference == "1230000000000000041"
    assert (await count_rows(db_url))["inbound_events"] == 0
    # A DM is still answered.
    await discord_gateway.dispatch("MESSAGE_CREATE", dm("1230000000000000042"))
    await wait_until(lambda: bool(discord_api.channel_messages("1120000000000000002")), 30)
    await idle(client)
    assert [turn.user_text for turn in await load_turns(db_url)] == ["hi, can you help me?"]
