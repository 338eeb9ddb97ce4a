"""Slash commands other than /ask, refusals and malformed interactions: answered, nothing stored.

Every answer here is the interaction's own response (type 4), ephemeral (flag 64), and
pings nobody; a refusal stores no row.
"""

from __future__ import annotations

import json

import pytest

from bot.channels.access import GROUPS_OFF_TEXT, NOT_ALLOWED_TEXT
from bot.channels.discord.commands import HELP_TEXT, NEW_TEXT, NOTHING_TO_STOP_TEXT
from bot.testing.discord_api import FakeDiscordApi
from tests.conftest import MakeClient
from tests.discord.conftest import (
    ALICE,
    BOB,
    ask,
    command,
    discord_section,
    idle,
    interact,
    post_signed,
)
from tests.helpers import count_rows, load_turns


def ephemeral(document: dict[str, object]) -> str:
    assert document["type"] == 4
    data = document["data"]
    assert isinstance(data, dict)
    assert data["flags"] == 64 and data["allowed_mentions"] == {"parse": []}
    content = data["content"]
    assert isinstance(content, str)
    return content


async def test_new_starts_a_fresh_conversation_in_the_channel(
    discord_api: FakeDiscordApi, make_client: MakeClient, db_url: str
) -> None:
    client = await make_client(db_url, discord=discord_section(discord_api.base_url))
    await interact(client, discord_api, ask("1220000000000000301", "one"))
    await idle(client)
    status, document, _ = await interact(client, discord_api, command("1220000000000000302", "new"))
    assert status == 200 and ephemeral(document) == NEW_TEXT
    await interact(client, discord_api, ask("1220000000000000303", "two"))
    await idle(client)
    turns = {turn.user_text: turn for turn in await load_turns(db_url)}
    assert turns["one"].conversation_id != turns["two"].conversation_id


async def test_stop_stats_help_and_an_unknown_command(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url, discord=discord_section(discord_api.base_url, admins=[ALICE])
    )
    _, document, _ = await interact(client, discord_api, command("1220000000000000311", "stop"))
    assert ephemeral(document) == NOTHING_TO_STOP_TEXT
    _, document, _ = await interact(client, discord_api, command("1220000000000000312", "help"))
    assert ephemeral(document) == HELP_TEXT
    _, document, _ = await interact(client, discord_api, command("1220000000000000313", "stats"))
    assert ephemeral(document).startswith("Your usage today")
    _, document, _ = await interact(
        client, discord_api, command("1220000000000000314", "stats", scope="all")
    )
    assert ephemeral(document).startswith("Nobody has used the bot today")
    _, document, _ = await interact(client, discord_api, command("1220000000000000315", "nope"))
    assert ephemeral(document).startswith("I do not know that command")
    await idle(client)
    assert await load_turns(sqlite_url) == []


@pytest.mark.parametrize("case", ["not_allowed", "groups_off", "too_long", "empty"])
async def test_a_refused_ask_is_answered_to_its_user_and_stores_nothing(
    discord_api: FakeDiscordApi, make_client: MakeClient, db_url: str, case: str
) -> None:
    table = {"allowed_users": [BOB]} if case == "not_allowed" else {}
    if case == "groups_off":
        table = {"groups": "off"}
    client = await make_client(
        db_url,
        discord=discord_section(discord_api.base_url, **table),
        server={"max_text_chars": 20},
    )
    text = {"too_long": "x" * 21, "empty": "   "}.get(case, "hello")
    status, document, _ = await interact(client, discord_api, ask("1220000000000000321", text))
    assert status == 200
    notice = ephemeral(document)
    expected = {"not_allowed": NOT_ALLOWED_TEXT, "groups_off": GROUPS_OFF_TEXT}
    if case in expected:
        assert notice == expected[case]
    else:
        assert "message" in notice
    await idle(client)
    assert (await count_rows(db_url))["inbound_events"] == 0
    assert await load_turns(db_url) == []
    if case == "groups_off":  # a DM is still answered
        _, document, _ = await interact(
            client, discord_api, ask("1220000000000000322", "hi", dm=True)
        )
        assert document == {"type": 5}


async def test_over_a_fair_use_limit_the_user_alone_hears_it_and_nothing_is_stored(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url,
        discord=discord_section(discord_api.base_url),
        limits={"messages_per_minute": 1},
    )
    await interact(client, discord_api, ask("1220000000000000331", "first"))
    body = ask("1220000000000000332", "second")
    status, document, _ = await interact(client, discord_api, body)
    assert (status, document) == (200, {"type": 5, "data": {"flags": 64}})
    await idle(client)
    assert [turn.user_text for turn in await load_turns(sqlite_url)] == ["first"]
    [notice] = discord_api.interaction_messages(body["token"])
    assert "too many" in notice.lower() or "limit" in notice.lower(), notice


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        b"not json",
        b'{"type": 2}',
        b'{"type": 99, "application_id": "1198765432109876543"}',
        json.dumps({**ask("1220000000000000341", "x"), "application_id": "1"}).encode(),
        json.dumps(
            {**ask("1220000000000000342", "x"), "channel_id": "../x", "channel": {"id": "../x"}}
        ).encode(),
    ],
)
async def test_a_signed_body_that_is_no_interaction_is_a_400(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str, raw: bytes
) -> None:
    client = await make_client(sqlite_url, discord=discord_section(discord_api.base_url))
    status, document, _ = await post_signed(client, raw)
    assert status == 400 and document["error"] == "bad_request"
    assert (await count_rows(sqlite_url))["inbound_events"] == 0


async def test_an_unknown_bot_name_is_a_404(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, discord=discord_section(discord_api.base_url))
    status, _, _ = await post_signed(client, b"{}", path="/discord/other")
    assert status == 404
