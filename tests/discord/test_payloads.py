"""Interactions and gateway messages -> what to do: pure functions, and Hypothesis over them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.channels.discord.payloads import (
    GatewayMessage,
    Ignored,
    MalformedInteraction,
    Ping,
    SlashCommand,
    parse_gateway_message,
    parse_interaction,
)
from tests.discord.conftest import APPLICATION_ID, BOT_USER_ID, load_fixture
from tests.security.fuzzing import JSON_VALUES, mutated

INTERACTIONS = [load_fixture(name) for name in ("ping", "ask_in_guild", "ask_in_dm")]
MESSAGES = [load_fixture(name) for name in ("message_create_mention", "message_create_dm")]


def test_the_fixtures_parse_to_what_they_are() -> None:
    ping, guild, dm = (parse_interaction(d, application_id=APPLICATION_ID) for d in INTERACTIONS)
    assert isinstance(ping, Ping)
    assert isinstance(guild, SlashCommand) and isinstance(dm, SlashCommand)
    assert guild.place.conversation_key == "channel:1110000000000000001"
    assert guild.place.user_name == "Alice" and not guild.place.is_dm
    assert dm.place.conversation_key == "dm:1120000000000000001" and dm.place.user_name is None
    assert guild.options == {"message": "What is a prefix cache?"}


def test_a_mention_is_cleaned_and_chatter_is_ignored_unless_groups_is_all() -> None:
    mention = parse_gateway_message(MESSAGES[0], bot_user_id=BOT_USER_ID, groups="mention")
    assert isinstance(mention, GatewayMessage) and mention.addressed
    assert mention.text == "what is a token?"
    chatter = {**MESSAGES[0], "content": "hello all", "mentions": []}
    assert isinstance(
        parse_gateway_message(chatter, bot_user_id=BOT_USER_ID, groups="mention"), Ignored
    )
    heard = parse_gateway_message(chatter, bot_user_id=BOT_USER_ID, groups="all")
    assert isinstance(heard, GatewayMessage) and not heard.addressed


@pytest.mark.parametrize(
    "change",
    [
        {"author": {"id": "1", "username": "x", "bot": True}},
        {"webhook_id": "5"},
        {"type": 7},  # a member joined
        {"author": {"id": BOT_USER_ID, "username": "testbot"}},
        {"content": f"<@{BOT_USER_ID}>"},  # nothing left once the mention is dropped
    ],
)
def test_bots_webhooks_system_messages_and_our_own_are_never_answered(
    change: dict[str, Any],
) -> None:
    payload = {**MESSAGES[0], **change}
    assert isinstance(
        parse_gateway_message(payload, bot_user_id=BOT_USER_ID, groups="all"), Ignored
    )


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(mutated(INTERACTIONS) | JSON_VALUES)
def test_any_interaction_body_parses_or_is_malformed(document: Any) -> None:
    try:
        parsed = parse_interaction(document, application_id=APPLICATION_ID)
    except MalformedInteraction:
        return
    if isinstance(parsed, SlashCommand):
        assert parsed.interaction_id.isdigit() and parsed.place.channel_id.isdigit()
        assert parsed.place.user_id.isdigit()


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(mutated(MESSAGES) | JSON_VALUES, st.sampled_from(["off", "mention", "all"]))
def test_any_gateway_payload_is_a_message_or_ignored(payload: Any, groups: Any) -> None:
    parsed = parse_gateway_message(payload, bot_user_id=BOT_USER_ID, groups=groups)
    assert isinstance(parsed, GatewayMessage | Ignored)
    if isinstance(parsed, GatewayMessage):
        assert parsed.text and parsed.place.channel_id.isdigit()
