"""Events API payloads (real shapes, in tests/slack/fixtures) -> answer or explicit ignore."""

from __future__ import annotations

import pytest

from bot.channels.slack.payloads import (
    Ignored,
    MalformedEvent,
    UrlVerification,
    UserMessage,
    clean_text,
    parse_body,
    to_inbound,
)
from tests.slack.conftest import load_fixture


def test_url_verification_returns_the_challenge() -> None:
    parsed = parse_body(load_fixture("url_verification"))
    assert parsed == UrlVerification("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P")


def test_channel_mention_starts_a_thread_at_the_mention() -> None:
    parsed = parse_body(load_fixture("app_mention"))
    assert isinstance(parsed, UserMessage)
    assert parsed.text == "what is a river & where does it go?"
    assert parsed.thread_ts == parsed.ts == "1700000001.000100"
    assert parsed.conversation_key == "C0001CHAN:thread:1700000001.000100"
    assert not parsed.is_dm
    assert (parsed.event_id, parsed.team_id, parsed.user_id) == (
        "Ev0001MENTION",
        "T0001TEAM",
        "U0001ALICE",
    )


def test_mention_inside_a_thread_continues_that_threads_conversation() -> None:
    first = parse_body(load_fixture("app_mention"))
    reply = parse_body(load_fixture("app_mention_in_thread"))
    assert isinstance(first, UserMessage) and isinstance(reply, UserMessage)
    assert reply.conversation_key == first.conversation_key
    assert reply.thread_ts == "1700000001.000100"
    assert reply.ts != reply.thread_ts


def test_dm_is_one_conversation_and_replies_top_level() -> None:
    parsed = parse_body(load_fixture("message_im"))
    assert isinstance(parsed, UserMessage)
    assert parsed.is_dm
    assert parsed.conversation_key == "im:D0001DM"
    assert parsed.thread_ts is None
    later = load_fixture("message_im")
    later["event"].update(ts="1700000900.000900", thread_ts="1700000100.000300")
    threaded = parse_body(later)
    assert isinstance(threaded, UserMessage)
    assert threaded.conversation_key == parsed.conversation_key
    assert threaded.thread_ts == "1700000100.000300"


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("message_im_own_reply", "event:message"),
        ("message_other_app", "event:message"),
        ("message_bot_message", "message:bot_message"),
        ("message_changed", "message:message_changed"),
        ("message_deleted", "message:message_deleted"),
        ("message_channel_join", "message:channel_join"),
        ("message_channel", "message:channel"),
        ("app_home_opened", "event:app_home_opened"),
        ("app_rate_limited", "envelope:app_rate_limited"),
    ],
)
def test_everything_else_is_ignored_with_a_reason(fixture: str, kind: str) -> None:
    parsed = parse_body(load_fixture(fixture))
    assert isinstance(parsed, Ignored)
    assert parsed.kind == kind
    assert parsed.reason
    assert not parsed.unknown


def test_our_own_user_without_bot_id_is_still_ignored() -> None:
    body = load_fixture("message_im")
    body["event"]["user"] = "UBOT0001"
    parsed = parse_body(body)
    assert isinstance(parsed, Ignored) and parsed.reason == "our own message"


def test_unknown_types_are_ignored_but_flagged() -> None:
    body = load_fixture("message_im")
    body["event"]["subtype"] = "huddle_thread"
    parsed = parse_body(body)
    assert isinstance(parsed, Ignored) and parsed.unknown
    body = load_fixture("app_home_opened")
    body["event"]["type"] = "shiny_new_event"
    parsed = parse_body(body)
    assert isinstance(parsed, Ignored) and parsed.unknown


def test_a_bare_mention_has_nothing_to_answer() -> None:
    body = load_fixture("app_mention")
    body["event"]["text"] = "<@UBOT0001>  "
    parsed = parse_body(body)
    assert isinstance(parsed, Ignored)


@pytest.mark.parametrize("body", [[], {"type": "event_callback"}, {"type": "url_verification"}])
def test_malformed_bodies_raise(body: object) -> None:
    with pytest.raises(MalformedEvent):
        parse_body(body)


def test_clean_text_keeps_readable_references() -> None:
    text = (
        "<@UBOT0001> ask <@U0002BOB> in <#C0001CHAN|general> about "
        "<https://example.com/a?b=1&amp;c=2|the doc>"
        " and <mailto:a@example.com> <!here> 1 &lt; 2 &gt; 0"
    )
    assert clean_text(text, bot_user_ids={"UBOT0001"}) == (
        "ask @U0002BOB in #general about the doc and mailto:a@example.com @here 1 < 2 > 0"
    )


def test_to_inbound_names_channel_speakers_only() -> None:
    mention = parse_body(load_fixture("app_mention"))
    dm = parse_body(load_fixture("message_im"))
    assert isinstance(mention, UserMessage) and isinstance(dm, UserMessage)
    channel_msg = to_inbound(mention, channel="slack:main", user_name="Alice")
    assert channel_msg.user_name == "Alice"
    assert channel_msg.owner == "T0001TEAM"
    assert channel_msg.reply_to["thread_ts"] == "1700000001.000100"
    assert to_inbound(mention, channel="slack:main", user_name=None).user_name == "U0001ALICE"
    assert to_inbound(dm, channel="slack:main", user_name="Alice").user_name is None
