"""Slash commands end to end: signed ``/new`` and ``/stop`` forms -> the real app and engine.

Forms are built from a real-shaped payload (``tests/slack/fixtures``) and signed
with slack_sdk's own ``SignatureVerifier.generate_signature``, like the events
in ``test_e2e.py``, whose helpers these tests share.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from urllib.parse import urlencode

import pytest

from bot.channels.retry import NOTHING_TO_RETRY_TEXT
from bot.channels.slack.commands import (
    DM_ONLY_TEXT,
    HELP_TEXT,
    NEW_TEXT,
    NOTHING_TO_STOP_TEXT,
    OTHER_APP_TEXT,
    RETRYING_TEXT,
    STOPPING_TEXT,
    UNKNOWN_TEXT,
    SlashCommand,
    parse_form,
)
from bot.engine.vllm_local import LocalVLLMEngine
from bot.testing.slack_api import FakeSlackApi
from tests.conftest import MakeClient
from tests.engines import SlowEngine
from tests.helpers import conversations_in, load_turns
from tests.slack.conftest import (
    APP_ID,
    CHANNEL,
    COMMAND_FIXTURE,
    DM,
    DM_KEY,
    FORM,
    TEAM,
    THREAD,
    command_form,
    dm_message,
    ephemeral,
    idle,
    in_channel,
    load_fixture,
    mention,
    post_command,
    post_event,
    slack_section,
)


async def wait_until(condition: Callable[[], bool], *, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# -- the payload -------------------------------------------------------------------------


def test_the_fixture_form_is_a_new_command_in_a_dm() -> None:
    command = parse_form(COMMAND_FIXTURE.read_text().strip())
    assert command == SlashCommand(
        name="new",
        typed="/new",
        api_app_id=APP_ID,
        team_id=TEAM,
        channel_id=DM,
        user_id="U0001ALICE",
    )
    assert command.in_dm


# -- verification ------------------------------------------------------------------------


@pytest.mark.parametrize("tamper", ["wrong_secret", "stale", "bad_signature", "unsigned"])
async def test_unsigned_or_stale_commands_get_401_and_change_nothing(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str, tamper: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    await post_event(client, dm_message("Ev1000DM", "1700000100.000300", "hello"))
    await idle(client)
    form = command_form("/new")
    if tamper == "wrong_secret":
        status, document = await post_command(client, form, secret="not-the-secret")
    elif tamper == "stale":
        status, document = await post_command(
            client, form, timestamp=int(time.time()) - 5 * 60 - 30
        )
    elif tamper == "bad_signature":
        status, document = await post_command(client, form, signature="v0=" + "0" * 64)
    else:
        response = await client.post(
            "/slack/commands", data=urlencode(form), headers={"Content-Type": FORM}
        )
        status, document = response.status, await response.json()
    assert (status, document["error"]) == (401, "auth")
    [conversation] = await conversations_in(sqlite_url)
    assert conversation.closed_at is None


async def test_slacks_ssl_check_gets_a_bare_200_even_unsigned(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    # What Slack sends to check a command's Request URL: no command, no signature.
    check = urlencode({"ssl_check": "1", "token": "verification-token"})
    response = await client.post("/slack/commands", data=check, headers={"Content-Type": FORM})
    assert response.status == 200 and await response.text() == ""
    # The same field does not let an unsigned command through.
    sneaky = urlencode({**command_form("/new"), "ssl_check": "1"})
    response = await client.post("/slack/commands", data=sneaky, headers={"Content-Type": FORM})
    assert response.status == 401
    assert await conversations_in(sqlite_url) == []


# -- /new --------------------------------------------------------------------------------


async def test_new_in_a_dm_starts_a_fresh_conversation(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    await post_event(client, dm_message("Ev1100DM", "1700000100.000300", "remember me"))
    await idle(client)
    assert await post_command(client, command_form("/new")) == (200, ephemeral(NEW_TEXT))
    await post_event(client, dm_message("Ev1101DM", "1700000200.000300", "who am I?"))
    await idle(client)

    first, second = await load_turns(sqlite_url)
    assert first.conversation_id != second.conversation_id
    assert (first.status, second.status) == ("done", "done")
    closed, fresh = await conversations_in(sqlite_url)
    # The command closed the very conversation the DM's messages were stored under.
    assert (closed.id, fresh.id) == (first.conversation_id, second.conversation_id)
    assert closed.external_key == fresh.external_key == DM_KEY
    assert closed.closed_at is not None and fresh.closed_at is None


# -- /stop -------------------------------------------------------------------------------


async def test_stop_cancels_the_reply_being_written_in_a_dm(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str, engine: LocalVLLMEngine
) -> None:
    client = await make_client(
        sqlite_url,
        slack=slack_section(slack_api.base_url),
        engine_override=SlowEngine(engine, 0.05),
        generation={"max_tokens": 600},
    )
    await post_event(client, dm_message("Ev1200DM", "1700000100.000300", "Say a lot"))
    await wait_until(
        lambda: any(m.channel == DM for m in slack_api.messages.values()),
        what="the reply to stream",
    )
    assert await post_command(client, command_form("/stop")) == (200, ephemeral(STOPPING_TEXT))
    await idle(client)

    [turn] = await load_turns(sqlite_url)
    assert (turn.status, turn.error_class) == ("failed", "cancelled")
    assert await post_command(client, command_form("/stop")) == (
        200,
        ephemeral(NOTHING_TO_STOP_TEXT),
    )


async def test_stop_with_nothing_running_says_so(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    nothing = (200, ephemeral(NOTHING_TO_STOP_TEXT))
    assert await post_command(client, command_form("/stop")) == nothing
    await post_event(client, dm_message("Ev1300DM", "1700000100.000300", "hello"))
    await idle(client)
    assert await post_command(client, command_form("/stop")) == nothing
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done"


# -- /retry ------------------------------------------------------------------------------


async def test_retry_in_a_dm_answers_the_last_message_again(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    assert await post_command(client, command_form("/retry")) == (
        200,
        ephemeral(NOTHING_TO_RETRY_TEXT),
    )
    await post_event(client, dm_message("Ev1500DM", "1700000100.000300", "tell me a joke"))
    await idle(client)
    assert await post_command(client, command_form("/retry")) == (200, ephemeral(RETRYING_TEXT))
    await idle(client)

    first, again = await load_turns(sqlite_url)
    assert (again.regenerates_turn_id, again.attempt, again.status) == (first.id, 2, "done")
    assert again.conversation_id == first.conversation_id
    assert again.prompt_tokens == first.prompt_tokens
    # Both replies went to the DM: the first stays, the second is the new attempt.
    replies = [m for m in slack_api.messages.values() if m.channel == DM]
    assert len(replies) == 2


# -- where the commands do not apply -----------------------------------------------------


async def test_in_a_channel_both_commands_point_to_the_dm_and_change_nothing(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    await post_event(client, mention("Ev1400MENTION", THREAD))
    await idle(client)
    for command in ("/new", "/stop", "/retry"):
        assert await post_command(client, in_channel(command)) == (200, ephemeral(DM_ONLY_TEXT))
    [conversation] = await conversations_in(sqlite_url)
    assert conversation.external_key == f"{CHANNEL}:thread:{THREAD}"
    assert conversation.closed_at is None


async def test_unknown_or_incomplete_commands_get_help_and_other_bodies_a_400(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    assert await post_command(client, command_form("/help")) == (200, ephemeral(UNKNOWN_TEXT))
    incomplete = {k: v for k, v in command_form("/new").items() if k != "channel_id"}
    assert await post_command(client, incomplete) == (200, ephemeral(HELP_TEXT))
    # Signed, but JSON: the Events API pointed at the commands URL, not a user typing.
    status, document = await post_command(
        client, json.dumps(load_fixture("url_verification")), content_type="application/json"
    )
    assert (status, document["error"]) == (400, "bad_request")
    assert await conversations_in(sqlite_url) == []


async def test_api_app_id_picks_the_app_among_those_sharing_a_secret(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    slack_api.add_workspace("xoxb-second-app", TEAM, bot_user_id="UBOT0002")
    second = {
        **slack_section(slack_api.base_url)[0],
        "name": "second",
        "bot_token": "xoxb-second-app",
        "app_id": "A0002APP",
    }
    client = await make_client(sqlite_url, slack=[*slack_section(slack_api.base_url), second])
    body = dm_message("Ev1500SECOND", "1700000100.000300", "hello second app")
    body["api_app_id"] = "A0002APP"
    body["authorizations"][0]["user_id"] = "UBOT0002"
    body["event"]["channel"] = "D0002DM"
    await post_event(client, body)
    await idle(client)

    unknown_app = command_form("/new", api_app_id="A0009GONE", channel_id="D0002DM")
    assert await post_command(client, unknown_app) == (200, ephemeral(OTHER_APP_TEXT))
    [conversation] = await conversations_in(sqlite_url)
    assert conversation.closed_at is None

    for_second = command_form("/new", api_app_id="A0002APP", channel_id="D0002DM")
    assert await post_command(client, for_second) == (200, ephemeral(NEW_TEXT))
    [conversation] = await conversations_in(sqlite_url)
    assert (conversation.channel, conversation.external_key) == ("slack:second", "im:D0002DM")
    assert conversation.closed_at is not None
