"""A Bot API call that fails for a passing reason (502, a dropped connection) is tried again:
every reply still arrives exactly once and every turn ends ``done``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.telegram.conftest import PRIVATE_CHAT, Service, private_update
from tests.telegram.test_webhook_e2e import expected_texts

OTHER_CHAT = PRIVATE_CHAT + 1


QUESTIONS = {PRIVATE_CHAT: "Tell me about Paris", OTHER_CHAT: "Tell me about Rome"}


@pytest.mark.parametrize("fault", ["502", "dropped connection"])
async def test_first_send_of_each_chat_fails_and_every_reply_arrives_once(
    start_service: Any, fault: str
) -> None:
    service: Service = await start_service()
    for chat_id, question in QUESTIONS.items():
        if fault == "502":
            service.fake.fail(502, "Bad Gateway", method="sendMessage", chat_id=chat_id)
        else:
            service.fake.drop_connection(method="sendMessage", chat_id=chat_id)
        assert await service.post(private_update(question, chat_id)) == 200
    await service.idle()

    turns = {turn.user_text: turn for turn in await service.turns()}
    assert [turn.status for turn in turns.values()] == ["done", "done"], [
        turn.error_class for turn in turns.values()
    ]
    for chat_id, question in QUESTIONS.items():
        sends = service.fake.calls_of("sendMessage", chat_id)
        assert [call.ok for call in sends][:2] == [False, True], "the failed send was retried"
        assert service.fake.texts(chat_id) == expected_texts(turns[question].reply_text or "")
