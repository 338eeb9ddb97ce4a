"""A Discord call that fails for a passing reason (a 5xx, a dropped connection, a short outage)
is tried again: every reply still arrives exactly once and every turn ends ``done``."""

from __future__ import annotations

import pytest

from bot.testing.discord_api import FakeDiscordApi
from tests.conftest import MakeClient
from tests.discord.conftest import ask, discord_section, idle, interact
from tests.helpers import load_turns

EDIT_ROUTE = "PATCH /webhooks/{id}/{token}/messages/{id}"
INTERACTIONS = ("1220000000000000901", "1220000000000000902")


@pytest.mark.parametrize("fault", ["502", "dropped connection", "outage of four 503s"])
async def test_first_edit_of_each_reply_fails_and_every_reply_arrives_once(
    discord_api: FakeDiscordApi, make_client: MakeClient, sqlite_url: str, fault: str
) -> None:
    client = await make_client(sqlite_url, discord=discord_section(discord_api.base_url))
    failed = 4 if fault.startswith("outage") else 1
    bodies = []
    for interaction_id in INTERACTIONS:
        if fault == "502":
            discord_api.fail_next(EDIT_ROUTE, 502)
        elif fault == "dropped connection":
            discord_api.drop_next(EDIT_ROUTE)
        else:
            discord_api.fail_next(EDIT_ROUTE, 503, times=failed)
        body = ask(interaction_id, "hello", dm=True)
        await interact(client, discord_api, body)
        await idle(client)
        bodies.append(body)

    turns = await load_turns(sqlite_url)
    assert [turn.status for turn in turns] == ["done", "done"], [t.error_message for t in turns]
    statuses = [call.status for call in discord_api.calls_on(EDIT_ROUTE)]
    assert statuses.count(200) >= 2 and len(statuses) - statuses.count(200) == 2 * failed
    for body, turn in zip(bodies, turns, strict=True):
        [shown] = discord_api.interaction_messages(body["token"])
        assert shown.strip() == (turn.reply_text or "").strip()
    assert discord_api.violations == []
