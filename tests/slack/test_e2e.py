"""End to end: signed Events API requests -> the real app and vLLM engine -> the fake Web API.

Requests are signed with slack_sdk's own ``SignatureVerifier.generate_signature``,
so the signature scheme under test is Slack's, not a copy of ours.
"""

from __future__ import annotations

import json
import time

import pytest

from bot.channels.slack.render import render_reply
from bot.testing.slack_api import FakeSlackApi
from tests.conftest import MakeClient
from tests.helpers import count_rows, load_turns
from tests.slack.conftest import (
    CHANNEL,
    DM,
    THREAD,
    TOKEN,
    idle,
    load_fixture,
    mention,
    post_event,
    slack_section,
)

# Slack wants its acknowledgement within 3 s; we hold ourselves to far less.
ACK_BUDGET_S = 3.0
# Small enough that even a short reply of the random demo model needs several messages.
LONG_REPLY_LIMIT = 40


# -- verification ------------------------------------------------------------------------


async def test_url_verification_echoes_the_challenge(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    status, text, _ = await post_event(client, load_fixture("url_verification"))
    assert status == 200
    assert json.loads(text) == {"challenge": load_fixture("url_verification")["challenge"]}


@pytest.mark.parametrize(
    "tamper",
    ["wrong_secret", "stale", "future", "bad_signature", "no_timestamp", "garbage_timestamp"],
)
async def test_unsigned_or_replayed_requests_get_401_and_store_nothing(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str, tamper: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    body = mention("Ev0100TAMPER", "1700000001.000100")
    now = int(time.time())
    if tamper == "wrong_secret":
        status, _, _ = await post_event(client, body, secret="not-the-secret")
    elif tamper == "stale":
        status, _, _ = await post_event(client, body, timestamp=now - 5 * 60 - 30)
    elif tamper == "future":
        status, _, _ = await post_event(client, body, timestamp=now + 5 * 60 + 30)
    elif tamper == "bad_signature":
        status, _, _ = await post_event(client, body, signature="v0=" + "0" * 64)
    else:
        raw = json.dumps(body)
        headers = {"Content-Type": "application/json", "X-Slack-Signature": "v0=abc"}
        if tamper == "garbage_timestamp":
            headers["X-Slack-Request-Timestamp"] = "yesterday"
        response = await client.post("/slack/events", data=raw, headers=headers)
        status = response.status
    assert status == 401
    await idle(client)
    assert (await count_rows(sqlite_url))["inbound_events"] == 0
    assert await load_turns(sqlite_url) == []
    assert slack_api.calls == []


async def test_a_request_inside_the_window_is_accepted(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    status, _, _ = await post_event(
        client, mention("Ev0101EDGE", "1700000001.000100"), timestamp=int(time.time()) - 4 * 60
    )
    assert status == 200
    await idle(client)
    assert len(await load_turns(sqlite_url)) == 1


# -- dedupe ------------------------------------------------------------------------------


async def test_three_retries_are_acknowledged_and_answered_once(
    slack_api: FakeSlackApi, make_client: MakeClient, db_url: str
) -> None:
    client = await make_client(db_url, slack=slack_section(slack_api.base_url))
    body = mention("Ev0200RETRY", THREAD)
    timings = []
    for retry in (None, 1, 2, 3):
        status, _, took = await post_event(client, body, retry_num=retry)
        assert status == 200
        timings.append(took)
    await idle(client)
    assert len(await load_turns(db_url)) == 1
    assert len(slack_api.thread(CHANNEL, THREAD)) == 1
    assert len(slack_api.calls_to("chat.startStream")) == 1
    assert max(timings) < ACK_BUDGET_S


async def test_a_retry_whose_first_delivery_was_lost_is_answered(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    body = mention("Ev0201LOST", THREAD)
    for retry in (2, 3):
        status, _, _ = await post_event(client, body, retry_num=retry)
        assert status == 200
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done"
    [message] = slack_api.thread(CHANNEL, THREAD)
    assert message.text == turn.reply_text


# -- conversations -----------------------------------------------------------------------


async def test_a_thread_is_one_conversation_with_named_speakers(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    await post_event(client, mention("Ev0300A", THREAD))
    await idle(client)
    await post_event(
        client, mention("Ev0301B", "1700000060.000200", thread_ts=THREAD, user="U0002BOB")
    )
    await idle(client)
    # A new mention at the top level is a new thread and a new conversation.
    await post_event(client, mention("Ev0302C", "1700000999.000300"))
    await idle(client)

    first, second, other = await load_turns(sqlite_url)
    assert first.conversation_id == second.conversation_id != other.conversation_id
    assert (first.user_name, second.user_name) == ("Alice", "Bob")
    assert first.user_text == "what is a river & where does it go?"
    assert all(t.status == "done" for t in (first, second, other))
    # The second turn re-used the first turn's KV blocks: token-exact history works via Slack too.
    assert (second.cached_tokens or 0) > 0
    shown = slack_api.thread_text(CHANNEL, THREAD)
    assert shown == [first.reply_text, second.reply_text]
    assert slack_api.thread_text(CHANNEL, "1700000999.000300") == [other.reply_text]
    assert len(slack_api.calls_to("users.info")) == 2  # Alice once (cached), Bob once


async def test_dms_are_one_conversation_without_names(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url, slack=slack_section(slack_api.base_url, streaming="update")
    )
    for index in range(2):
        body = load_fixture("message_im")
        ts = f"170000010{index}.000300"
        body["event_id"] = f"Ev040{index}DM"
        body["event"].update(ts=ts, event_ts=ts, text=f"question {index}")
        status, _, _ = await post_event(client, body)
        assert status == 200
        await idle(client)
    first, second = await load_turns(sqlite_url)
    assert first.conversation_id == second.conversation_id
    assert first.user_name is None and second.user_name is None
    # Update mode in a DM: plain top-level replies (an all-blank reply is never posted).
    rendered = [render_reply(t.reply_text or "").text for t in (first, second)]
    assert slack_api.thread_text(DM, None) == [text for text in rendered if text.strip()]
    assert not slack_api.calls_to("users.info")


async def test_own_and_other_bot_messages_never_start_a_turn(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    await post_event(client, load_fixture("message_im"))
    await idle(client)
    calls = len(slack_api.calls)
    # Slack echoes our reply back as message.im; other apps and edits come too.
    for name in (
        "message_im_own_reply",
        "message_other_app",
        "message_bot_message",
        "message_changed",
        "message_deleted",
        "message_channel",
        "message_channel_join",
        "app_home_opened",
        "app_rate_limited",
    ):
        status, _, _ = await post_event(client, load_fixture(name))
        assert status == 200, name
    await idle(client)
    assert len(await load_turns(sqlite_url)) == 1
    assert (await count_rows(sqlite_url))["inbound_events"] == 1
    assert len(slack_api.calls) == calls


# -- streaming ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["stream", "update", "auto-without-streams"])
async def test_reply_reaches_the_thread_with_either_api(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str, mode: str
) -> None:
    streaming = "auto" if mode.startswith("auto") else mode
    if mode.startswith("auto"):
        slack_api.workspaces[TOKEN].streaming = False
    client = await make_client(
        sqlite_url,
        slack=slack_section(slack_api.base_url, streaming=streaming),
        generation={"max_tokens": 96},
    )
    await post_event(client, mention("Ev0500MODE", THREAD))
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done", turn.error_message
    [message] = slack_api.thread(CHANNEL, THREAD)
    if mode == "stream":
        assert message.via == "stream" and message.text == turn.reply_text
    else:
        assert message.via == "post"
        assert message.text == render_reply(turn.reply_text or "").text
    assert slack_api.unchanged_updates == 0
    assert all(
        (c.args.get("text") or c.args.get("markdown_text") or "").strip()
        for c in slack_api.calls
        if c.method in ("chat.postMessage", "chat.update", "chat.appendStream")
    )


async def test_429_from_slack_is_waited_out(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    slack_api.intervals["chat.update"] = 0.5
    client = await make_client(
        sqlite_url,
        slack=slack_section(slack_api.base_url, streaming="update", update_interval_s=0.0),
        generation={"max_tokens": 128},
    )
    await post_event(client, mention("Ev0600RATE", THREAD))
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done", turn.error_message
    assert [c for c in slack_api.calls if c.status == 429], "no 429 provoked"
    assert slack_api.violations == 0
    assert slack_api.thread_text(CHANNEL, THREAD) == [render_reply(turn.reply_text or "").text]


@pytest.mark.parametrize("streaming", ["stream", "update"])
async def test_long_reply_continues_in_further_messages(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str, streaming: str
) -> None:
    client = await make_client(
        sqlite_url,
        slack=slack_section(
            slack_api.base_url, streaming=streaming, max_message_chars=LONG_REPLY_LIMIT
        ),
        generation={"max_tokens": 256},
    )
    await post_event(client, mention("Ev0700LONG", THREAD))
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done", turn.error_message
    reply = turn.reply_text or ""
    # The random demo model stops where it likes: the limit is set low enough to split anyway.
    assert len(reply) > 2 * LONG_REPLY_LIMIT, (
        "the demo model's reply is too short to need splitting"
    )
    shown = slack_api.thread(CHANNEL, THREAD)
    assert len(shown) >= len(reply) // LONG_REPLY_LIMIT
    assert all(len(m.text) <= LONG_REPLY_LIMIT for m in shown)
    if streaming == "stream":
        assert "".join(m.text for m in shown) == reply


async def test_revoked_token_fails_the_turn_as_auth(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    slack_api.revoke(TOKEN)
    status, _, _ = await post_event(client, mention("Ev0800AUTH", THREAD))
    assert status == 200
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert (turn.status, turn.error_class) == ("failed", "auth")
    assert slack_api.thread(CHANNEL, THREAD) == []


async def test_missing_channel_fails_the_turn_as_delivery(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(sqlite_url, slack=slack_section(slack_api.base_url))
    slack_api.channel_errors[CHANNEL] = "not_in_channel"
    await post_event(client, mention("Ev0801GONE", THREAD))
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert (turn.status, turn.error_class) == ("failed", "delivery")


async def test_each_app_answers_its_own_events_with_its_own_token(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    slack_api.add_workspace("xoxb-second-app", "T0002OTHER", bot_user_id="UBOT0002")
    second = {
        **slack_section(slack_api.base_url)[0],
        "name": "second",
        "signing_secret": "second-app-signing-secret",
        "bot_token": "xoxb-second-app",
        "app_id": "A0002APP",
    }
    client = await make_client(sqlite_url, slack=[*slack_section(slack_api.base_url), second])
    body = mention("Ev0900SECOND", THREAD)
    body.update(api_app_id="A0002APP", team_id="T0002OTHER")
    body["authorizations"][0].update(team_id="T0002OTHER", user_id="UBOT0002")
    body["event"]["text"] = "<@UBOT0002> hello second app"
    # Signed with the first app's secret: not the second app's event.
    status, _, _ = await post_event(client, body)
    assert status == 200
    await idle(client)
    assert await load_turns(sqlite_url) == []
    status, _, _ = await post_event(client, body, secret="second-app-signing-secret")
    assert status == 200
    await idle(client)
    [turn] = await load_turns(sqlite_url)
    assert (turn.channel, turn.status) == ("slack:second", "done")
    assert {c.team_id for c in slack_api.calls} == {"T0002OTHER"}


# -- messages we decline -----------------------------------------------------------------


async def test_a_message_over_the_length_limit_is_declined_once_in_its_thread(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url, slack=slack_section(slack_api.base_url), server={"max_text_chars": 100}
    )
    body = mention("Ev0900LONG", THREAD)
    body["event"]["text"] = "<@UBOT0001> " + "x" * 150
    for retry in (None, 1):  # Slack's retry of the same event: one notice
        status, _, _ = await post_event(client, body, retry_num=retry)
        assert status == 200
    await idle(client)

    assert await load_turns(sqlite_url) == []
    assert (await count_rows(sqlite_url))["inbound_events"] == 0
    # Apologies are posted in italics.
    assert slack_api.thread_text(CHANNEL, THREAD) == [
        "_Sorry, your message is too long for me (150 characters; the limit is 100). "
        "Please shorten it._"
    ]


async def test_a_message_over_the_rate_limit_is_told_when_to_come_back(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url,
        slack=slack_section(slack_api.base_url),
        limits={"messages_per_minute": 1, "tokens_per_day": 0},
    )
    await post_event(client, mention("Ev0910FIRST", THREAD))
    await idle(client)
    await post_event(client, mention("Ev0911SECOND", "1700000060.000200", thread_ts=THREAD))
    await idle(client)

    [turn] = await load_turns(sqlite_url)
    assert turn.status == "done"
    reply, notice = slack_api.thread_text(CHANNEL, THREAD)
    assert reply == turn.reply_text
    assert notice.startswith("_Sorry, too many messages in a short time. Please try again in")
