"""Who may talk to a Telegram bot: allow-list, admins, group policy. Real app and engine,
the strict fake Bot API; payloads from ``tests/telegram/fixtures``.

A refusal is one short notice in the chat (never silence), and nothing of it is stored:
no conversation, turn, history entry or inbound event.
"""

from __future__ import annotations

from typing import Any

import pytest

from bot.channels.access import GROUPS_OFF_TEXT, NOT_ALLOWED_TEXT
from bot.config import ConfigError, load_settings
from tests.helpers import count_rows
from tests.telegram.conftest import (
    GROUP_CHAT,
    PRIVATE_CHAT,
    Service,
    command_update,
    fixture_update,
    private_update,
)

STRANGER = 333333333
ALICE = str(PRIVATE_CHAT)
BOB = "222222222"  # the sender of the group fixtures


def from_stranger(update: dict[str, Any]) -> dict[str, Any]:
    sender = update["message"]["from"]
    sender.pop("username", None)
    update["message"]["chat"].pop("username", None)
    return update


async def test_a_user_off_the_allow_list_gets_one_notice_and_nothing_is_stored(
    start_service: Any,
) -> None:
    service: Service = await start_service({"allowed_users": [ALICE]})
    message = from_stranger(private_update("hello?", chat_id=STRANGER))
    assert await service.post(message) == 200
    assert await service.post(message) == 200  # redelivered: no second notice
    command = from_stranger(command_update("new", chat_id=STRANGER))
    assert await service.post(command) == 200
    assert await service.post(command) == 200
    await service.idle()
    await service.fake.wait_until(lambda: len(service.fake.texts(STRANGER)) >= 2)
    assert service.fake.texts(STRANGER) == [NOT_ALLOWED_TEXT, NOT_ALLOWED_TEXT]
    assert set((await count_rows(service.db_url)).values()) == {0}

    assert await service.post(private_update("I am on the list")) == 200
    await service.idle()
    [turn] = await service.turns()
    assert (turn.user_id, turn.status) == (ALICE, "done")
    assert NOT_ALLOWED_TEXT not in service.fake.texts(PRIVATE_CHAT)


async def test_usernames_on_the_list_match_case_insensitively(start_service: Any) -> None:
    service: Service = await start_service({"allowed_users": ["@Alice_L"]})
    assert await service.post(private_update("by name")) == 200
    await service.idle()
    [turn] = await service.turns()
    assert turn.status == "done"


async def test_admins_may_talk_and_are_held_to_no_fair_use_limit(start_service: Any) -> None:
    service: Service = await start_service(
        {"allowed_users": [BOB], "admins": [ALICE]},
        limits={"messages_per_minute": 1, "tokens_per_day": 0},
    )
    for text in ("one", "two", "three"):
        assert await service.post(private_update(text)) == 200
        await service.idle()
    assert [turn.status for turn in await service.turns()] == ["done"] * 3
    assert not any(text.startswith("Sorry") for text in service.fake.texts(PRIVATE_CHAT))


async def test_groups_off_answers_addressed_messages_with_a_notice(start_service: Any) -> None:
    service: Service = await start_service({"groups": "off"})
    assert await service.post(fixture_update("group_not_addressed")) == 200
    assert await service.post(fixture_update("group_mention")) == 200
    await service.idle()
    await service.fake.wait_until(lambda: bool(service.fake.texts(GROUP_CHAT)))
    assert service.fake.texts(GROUP_CHAT) == [GROUPS_OFF_TEXT]
    [notice] = service.fake.calls_of("sendMessage", GROUP_CHAT)
    assert notice.params["reply_parameters"]["message_id"] == 901
    assert set((await count_rows(service.db_url)).values()) == {0}


async def test_groups_all_answers_every_message_from_allowed_members(start_service: Any) -> None:
    service: Service = await start_service({"groups": "all", "allowed_users": [BOB]})
    # Alice is not on the list: her chatter is ignored quietly, not answered with a notice.
    assert await service.post(fixture_update("group_not_addressed")) == 200
    await service.idle()
    assert service.fake.texts(GROUP_CHAT) == []
    assert set((await count_rows(service.db_url)).values()) == {0}

    unaddressed = fixture_update("group_not_addressed")
    unaddressed["message"]["from"] = fixture_update("group_mention")["message"]["from"]
    assert await service.post(unaddressed) == 200
    assert await service.post(fixture_update("group_mention")) == 200
    await service.idle()
    turns = sorted(await service.turns(), key=lambda turn: turn.seq)
    assert [(turn.user_name, turn.user_text, turn.status) for turn in turns] == [
        ("Bob", "I liked it a lot", "done"),
        ("Bob", "who wrote Moby-Dick?", "done"),
    ]


async def test_in_a_group_only_an_addressed_refusal_gets_a_notice(start_service: Any) -> None:
    service: Service = await start_service({"allowed_users": [ALICE]})
    assert await service.post(fixture_update("group_mention")) == 200  # Bob, addressed
    await service.idle()
    await service.fake.wait_until(lambda: bool(service.fake.texts(GROUP_CHAT)))
    assert service.fake.texts(GROUP_CHAT) == [NOT_ALLOWED_TEXT]
    assert set((await count_rows(service.db_url)).values()) == {0}


@pytest.mark.parametrize(
    ("entry", "key"),
    [("alice smith", "telegram.0.allowed_users"), ("@ab", "telegram.0.admins")],
)
def test_a_bad_list_entry_is_a_clear_config_error(entry: str, key: str) -> None:
    field = key.rsplit(".", 1)[1]
    table = {"name": "x", "token": "1:a", field: [entry]}
    with pytest.raises(ConfigError) as error:
        load_settings(None, telegram=[table])
    assert key in str(error.value)
    assert "neither a Telegram user id (digits) nor a @username" in str(error.value)
