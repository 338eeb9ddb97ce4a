"""Display names from users.info: cached, and never worth losing a message over."""

from __future__ import annotations

from bot.testing.slack_api import FakeSlackApi
from tests.slack.conftest import TEAM, MakeChannel


async def test_names_are_looked_up_once_then_cached(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    users = make_channel().users
    assert await users.name(TEAM, "U0001ALICE") == "Alice"
    assert await users.name(TEAM, "U0001ALICE") == "Alice"
    assert await users.name(TEAM, "U0002BOB") == "Bob"
    assert len(slack_api.calls_to("users.info")) == 2


async def test_unknown_user_falls_back_to_the_id(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    users = make_channel().users
    assert await users.name(TEAM, "U0404GONE") == "U0404GONE"


async def test_slow_lookup_falls_back_within_the_deadline(
    slack_api: FakeSlackApi, make_channel: MakeChannel
) -> None:
    slack_api.delays["users.info"] = 1.0
    users = make_channel(user_lookup_timeout_s=0.1).users
    assert await users.name(TEAM, "U0001ALICE") == "U0001ALICE"
