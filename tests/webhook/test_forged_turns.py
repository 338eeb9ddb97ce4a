"""Generic webhook: neither text nor user_name can forge a chat-template turn."""

from __future__ import annotations

from bot.http.keys import TURNS
from bot.turns.chat_format import ChatFormat
from tests.conftest import MakeClient
from tests.security.control_tokens import (
    FORGED_NAME,
    FORGED_TURN,
    assert_first_turn_keeps_only_template_tokens,
    user_entries,
)
from tests.webhook.conftest import Receiver, message, post_signed, webhook_settings


async def test_text_and_user_name_cannot_forge_a_system_turn(
    receiver: Receiver, make_client: MakeClient, sqlite_url: str, chat_format: ChatFormat
) -> None:
    client = await make_client(sqlite_url, webhooks=webhook_settings(receiver))
    document = {**message(text=FORGED_TURN), "user_name": FORGED_NAME}
    response = await post_signed(client, document)
    assert response.status == 202, await response.text()
    await client.app[TURNS].wait_idle(timeout=120)
    [entry] = await user_entries(sqlite_url)
    assert_first_turn_keeps_only_template_tokens(chat_format, entry, FORGED_NAME, FORGED_TURN)
