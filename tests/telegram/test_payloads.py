"""Inbound updates -> a message, a command or an explicit ignore, on real update payloads."""

from __future__ import annotations

import pytest

from bot.channels.base import InboundMessage
from bot.channels.telegram.payloads import (
    IGNORED_UPDATE_TYPES,
    BotIdentity,
    Command,
    EditedMessage,
    Ignored,
    Parsed,
    parse_update,
)
from tests.telegram.conftest import FIXTURES, load_update

BOT = BotIdentity(id=7000000001, username="TestChatBot")
CHANNEL = "telegram:testbot"
GROUP_KEY = "chat:-1001234567890"


def parse(name: str) -> Parsed:
    return parse_update(load_update(name), bot=BOT, channel=CHANNEL)


def test_private_text_is_a_turn_of_the_chat() -> None:
    parsed = parse("private_text")
    assert parsed == InboundMessage(
        channel=CHANNEL,
        event_id="510000001",
        owner=CHANNEL,
        conversation_key="chat:111111111",
        text="What is the capital of France?",
        user_id="111111111",
        user_name=None,  # one speaker: no name in front of the text
        reply_to={
            "chat_id": 111111111,
            "chat_type": "private",
            "message_id": 31,
            "message_thread_id": None,
        },
        received_at=parsed.received_at,  # type: ignore[union-attr]
    )


@pytest.mark.parametrize("name", ["start", "help", "new", "stop"])
def test_private_commands(name: str) -> None:
    parsed = parse(f"private_command_{name}")
    assert isinstance(parsed, Command)
    assert parsed.name == name and parsed.conversation_key == "chat:111111111"


def test_unknown_command_in_private_is_answered_with_help() -> None:
    parsed = parse("private_command_unknown")
    assert isinstance(parsed, Command) and parsed.name == "unknown" and parsed.args == "Paris"


def test_group_mention_is_cut_from_the_text_and_the_sender_named() -> None:
    parsed = parse("group_mention")
    assert isinstance(parsed, InboundMessage)
    assert parsed.text == "who wrote Moby-Dick?"
    assert parsed.user_name == "Bob"
    assert parsed.conversation_key == GROUP_KEY
    assert parsed.reply_to["message_id"] == 901


def test_mention_offsets_are_utf16_and_case_insensitive() -> None:
    parsed = parse("group_mention_after_emoji")
    assert isinstance(parsed, InboundMessage)
    assert parsed.text == "Hey 👋 , summarise chapter 1"
    assert parsed.user_name == "Alice Liddell"


@pytest.mark.parametrize(
    "name", ["group_reply_to_bot", "group_text_mention", "basic_group_mention"]
)
def test_group_messages_addressed_to_the_bot(name: str) -> None:
    assert isinstance(parse(name), InboundMessage)


def test_reply_thread_in_a_plain_supergroup_stays_in_the_group_conversation() -> None:
    parsed = parse("group_reply_thread_not_topic")
    assert isinstance(parsed, InboundMessage)
    assert parsed.conversation_key == GROUP_KEY
    assert parsed.reply_to["message_thread_id"] is None


def test_forum_topic_is_its_own_conversation() -> None:
    parsed = parse("forum_topic_mention")
    assert isinstance(parsed, InboundMessage)
    assert parsed.conversation_key == "chat:-1009876543210:topic:12"
    assert parsed.reply_to["message_thread_id"] == 12
    assert parsed.text == "how do refunds work?"


def test_topic_created_by_the_bot_is_not_a_reply_to_it() -> None:
    parsed = parse("forum_topic_created_by_bot_not_addressed")
    assert isinstance(parsed, Ignored) and parsed.reason == "group message not addressed to the bot"


def test_anonymous_admin_speaks_with_the_group_name() -> None:
    parsed = parse("group_anonymous_admin")
    assert isinstance(parsed, InboundMessage) and parsed.user_name == "Book Club"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("group_not_addressed", "group message not addressed to the bot"),
        ("group_mention_other", "group message not addressed to the bot"),
        ("group_command_other_bot", "command for another bot"),
        ("group_from_other_bot", "sent by a bot"),
        ("private_photo", "no text"),
        ("edited_message_group_not_addressed", "group message not addressed to the bot"),
    ],
)
def test_ignored_messages(name: str, reason: str) -> None:
    parsed = parse(name)
    assert isinstance(parsed, Ignored) and parsed.reason == reason


def test_group_commands_addressed_or_bare() -> None:
    addressed = parse("group_command_addressed")
    assert isinstance(addressed, Command) and addressed.name == "new"
    assert addressed.conversation_key == GROUP_KEY
    bare = parse("group_command_bare")
    assert isinstance(bare, Command) and bare.name == "stop"


def test_edited_private_message_names_the_message_it_edits() -> None:
    parsed = parse("edited_message_private")
    assert isinstance(parsed, EditedMessage)
    assert parsed.message.text == "What is the capital of Italy?"
    assert parsed.message.event_id == "510000022"  # its own update, so it dedupes on its own
    edited = load_update("edited_message_private")["edited_message"]
    assert parsed.edited == {
        "chat_id": edited["chat"]["id"],
        "message_id": edited["message_id"],
    }
    # The turn of the original message stores the same address in its reply_to.
    assert all(parsed.message.reply_to[key] == value for key, value in parsed.edited.items())


@pytest.mark.parametrize(
    "name",
    [
        "callback_query",
        "my_chat_member",
        "chat_member",
        "channel_post",
        "message_reaction",
        "inline_query",
        "poll",
    ],
)
def test_listed_update_types_are_ignored_by_name(name: str) -> None:
    parsed = parse(name)
    assert isinstance(parsed, Ignored) and parsed.known
    assert parsed.update_type in IGNORED_UPDATE_TYPES


def test_unknown_update_type_is_ignored_loudly() -> None:
    parsed = parse("unknown_future_type")
    assert isinstance(parsed, Ignored) and not parsed.known


def test_every_fixture_parses() -> None:
    for path in FIXTURES.glob("*.json"):
        assert parse(path.stem) is not None
