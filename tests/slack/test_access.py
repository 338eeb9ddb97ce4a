"""Who may talk to a Slack app: allow-list, admins, channel policy. Real app and engine,
the strict fake Slack Web API; payloads from ``tests/slack/fixtures``.

A refusal is one short notice where the message was written (never silence), and
nothing of it is stored: no conversation, turn, history entry or inbound event.
"""

from __future__ import annotations

from typing import Any

import pytest

from bot.channels.access import GROUPS_OFF_TEXT, NOT_ALLOWED_TEXT
from bot.config import ConfigError, load_settings
from bot.testing.slack_api import FakeSlackApi
from tests.conftest import MakeClient
from tests.helpers import conversations_in, count_rows, load_turns
from tests.slack.conftest import (
    CHANNEL,
    DM,
    THREAD,
    command_form,
    dm_message,
    ephemeral,
    idle,
    load_fixture,
    mention,
    post_command,
    post_event,
    slack_section,
)

ALICE = "U0001ALICE"
BOB = "U0002BOB"


def italic(text: str) -> str:
    return f"_{text}_"  # how the sink posts an apology


def channel_message(event_id: str, ts: str, text: str, user: str = ALICE) -> dict[str, Any]:
    body = load_fixture("message_channel")
    body["event_id"] = event_id
    body["event"].update(ts=ts, event_ts=ts, text=text, user=user)
    return body


async def test_a_user_off_the_allow_list_gets_one_notice_and_nothing_is_stored(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url, slack=slack_section(slack_api.base_url, allowed_users=[BOB])
    )
    dm = dm_message("Ev3000DM", "1700000100.000300", "hello?")
    mentioned = mention("Ev3001MENTION", THREAD)
    for retry in (None, 1):  # Slack's retry of the same event: one notice
        for body in (dm, mentioned):
            status, _, _ = await post_event(client, body, retry_num=retry)
            assert status == 200
    await idle(client)
    assert slack_api.thread_text(DM, None) == [italic(NOT_ALLOWED_TEXT)]
    assert slack_api.thread_text(CHANNEL, THREAD) == [italic(NOT_ALLOWED_TEXT)]
    assert await post_command(client, command_form("/new")) == (200, ephemeral(NOT_ALLOWED_TEXT))
    assert set((await count_rows(sqlite_url)).values()) == {0}

    await post_event(client, mention("Ev3002BOB", "1700000200.000100", user=BOB))
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert (turn.user_id, turn.status) == (BOB, "done")


async def test_admins_may_talk_and_are_held_to_no_fair_use_limit(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url,
        slack=slack_section(slack_api.base_url, allowed_users=[BOB], admins=[ALICE]),
        limits={"messages_per_minute": 1, "tokens_per_day": 0},
    )
    for i in range(3):
        await post_event(client, dm_message(f"Ev310{i}DM", f"170000010{i}.000300", f"m{i}"))
        await idle(client)
    assert [turn.status for turn in await load_turns(sqlite_url)] == ["done"] * 3
    assert not any(text.startswith("_Sorry") for text in slack_api.thread_text(DM, None))


async def test_channels_off_answers_mentions_with_a_notice_and_dms_as_usual(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url, channels="off"))
    await post_event(client, mention("Ev3200MENTION", THREAD))
    await idle(client)
    assert slack_api.thread_text(CHANNEL, THREAD) == [italic(GROUPS_OFF_TEXT)]
    assert set((await count_rows(sqlite_url)).values()) == {0}

    await post_event(client, dm_message("Ev3201DM", "1700000100.000300", "hello"))
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done"


async def test_channels_all_answers_every_message_once_and_ignores_strangers_chatter(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url,
        slack=slack_section(slack_api.base_url, channels="all", allowed_users=[ALICE]),
    )
    # A mention arrives twice, as a message and as an app_mention: answered once.
    await post_event(client, channel_message("Ev3300MSG", THREAD, "<@UBOT0001> a river?"))
    await post_event(client, mention("Ev3301MENTION", THREAD))
    await post_event(client, channel_message("Ev3302MSG", "1700000300.000100", "no mention"))
    # Bob is not on the list: his chatter gets nothing, his mention a notice.
    await post_event(client, channel_message("Ev3303MSG", "1700000400.000100", "hi", user=BOB))
    bob_asks = "1700000500.000100"
    await post_event(client, channel_message("Ev3304MSG", bob_asks, "<@UBOT0001> hi?", user=BOB))
    await idle(client)

    turns = sorted(await load_turns(sqlite_url), key=lambda turn: turn.created_at)
    assert [(turn.user_text, turn.status) for turn in turns] == [
        ("a river?", "done"),
        ("no mention", "done"),
    ]
    assert len({turn.conversation_id for turn in turns}) == 2  # a thread each
    assert slack_api.thread_text(CHANNEL, "1700000400.000100") == []
    assert slack_api.thread_text(CHANNEL, bob_asks) == [italic(NOT_ALLOWED_TEXT)]
    assert len(await conversations_in(sqlite_url)) == 2


def test_a_bad_user_id_is_a_clear_config_error() -> None:
    table = {"name": "x", "signing_secret": "s", "bot_token": "t", "admins": ["alice"]}
    with pytest.raises(ConfigError) as error:
        load_settings(None, slack=[table])
    assert "slack.0.admins" in str(error.value)
    assert "'alice' is not a Slack user id" in str(error.value)
