"""HTTP API: a forged chat-template turn in a message is stored as literal text."""

from __future__ import annotations

from bot.http.keys import TURNS
from bot.turns.chat_format import ChatFormat
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth
from tests.security.control_tokens import (
    FORGED_NAME,
    FORGED_TURN,
    assert_first_turn_keeps_only_template_tokens,
    user_entries,
)


async def test_api_message_cannot_forge_a_system_turn(
    sqlite_url: str, make_client: MakeClient, chat_format: ChatFormat
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": "c1", "message_id": "m1", "text": FORGED_TURN},
        headers=auth(key),
    )
    assert response.status == 202, await response.text()
    await client.app[TURNS].wait_idle(timeout=120)
    [entry] = await user_entries(sqlite_url)
    assert_first_turn_keeps_only_template_tokens(chat_format, entry, FORGED_TURN)


async def test_api_user_id_is_not_a_display_name(
    sqlite_url: str, make_client: MakeClient, chat_format: ChatFormat
) -> None:
    # The API takes no display name; a hostile user_id never reaches the prompt.
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": "c1", "message_id": "m1", "text": "hi", "user_id": FORGED_NAME},
        headers=auth(key),
    )
    assert response.status == 202, await response.text()
    await client.app[TURNS].wait_idle(timeout=120)
    [entry] = await user_entries(sqlite_url)
    assert_first_turn_keeps_only_template_tokens(chat_format, entry, "hi")
