"""``/mode`` on Telegram: list the personas, or start a fresh conversation with one.

Real app and engine (a recording pass-through shows what the engine was asked),
the strict fake Bot API for the notices and replies.
"""

from __future__ import annotations

from typing import Any

import pytest

from bot.channels.modes import WHY_FRESH
from bot.channels.telegram.commands import HELP_TEXT, NEW_TEXT
from bot.engine.vllm_local import LocalVLLMEngine
from bot.testing.telegram_api import FakeTelegram
from bot.turns.chat_format import ChatFormat
from tests.conftest import TEST_SYSTEM_PROMPT, MakeClient
from tests.engine_spy import RecordingEngine
from tests.helpers import PERSONAS, PIRATE_PROMPT, conversations_in, load_turns
from tests.telegram.conftest import (
    PRIVATE_CHAT,
    Service,
    bot_table,
    private_update,
)


@pytest.fixture
async def start_service(
    fake_telegram: FakeTelegram, sqlite_url: str, make_client: MakeClient
) -> Any:
    async def start(**sections: Any) -> Service:
        client = await make_client(sqlite_url, telegram=[bot_table(fake_telegram)], **sections)
        return Service(client, fake_telegram, sqlite_url)

    return start


def command_with_args(name: str, args: str) -> dict[str, Any]:
    update = private_update(f"/{name} {args}".rstrip())
    update["message"]["entities"] = [{"offset": 0, "length": len(name) + 1, "type": "bot_command"}]
    return update


async def notice(service: Service, count: int) -> str:
    """The ``count``-th message the bot sent to the private chat (1-based), once it is there."""
    await service.fake.wait_until(
        lambda: len(service.fake.texts(PRIVATE_CHAT)) >= count, what=f"message {count}"
    )
    return service.fake.texts(PRIVATE_CHAT)[count - 1]


async def test_mode_lists_starts_a_persona_conversation_and_new_goes_back(
    start_service: Any, engine: LocalVLLMEngine, chat_format: ChatFormat
) -> None:
    spy = RecordingEngine(engine)
    service: Service = await start_service(personas=PERSONAS, engine_override=spy)

    assert await service.post(command_with_args("mode", "")) == 200
    listed = await notice(service, 1)
    assert "pirate - Talks like a pirate" in listed and "\nterse" in listed
    assert WHY_FRESH in listed
    # The typed name is data: never said back, nothing stored.
    assert await service.post(command_with_args("mode", "<b>captain</b>")) == 200
    unknown = await notice(service, 2)
    assert unknown.startswith("I do not know that persona.") and "captain" not in unknown
    assert await conversations_in(service.db_url) == []

    update = command_with_args("mode", "pirate")
    assert await service.post(update) == 200
    assert await service.post(update) == 200  # redelivered: carried out and confirmed once
    assert (await notice(service, 3)).startswith("Started a new conversation as pirate.")
    assert await service.post(private_update("ahoy")) == 200
    await service.idle()
    assert await service.post(command_with_args("new", "")) == 200
    await service.fake.wait_until(lambda: NEW_TEXT in service.fake.texts(PRIVATE_CHAT))
    assert await service.post(private_update("hello again")) == 200
    await service.idle()

    texts = service.fake.texts(PRIVATE_CHAT)
    assert sum(text.startswith("Started a new conversation as") for text in texts) == 1
    pirate_conversation, default_conversation = await conversations_in(service.db_url)
    assert (pirate_conversation.persona, default_conversation.persona) == ("pirate", None)
    ahoy, again = await load_turns(service.db_url)
    assert ahoy.conversation_id == pirate_conversation.id
    assert again.conversation_id == default_conversation.id
    pirate_call, default_call = spy.calls
    pirate_prompt = chat_format.decode(pirate_call.request.prompt_token_ids)
    assert PIRATE_PROMPT in pirate_prompt and TEST_SYSTEM_PROMPT not in pirate_prompt
    assert (pirate_call.request.temperature, pirate_call.request.max_tokens) == (0.7, 7)
    assert TEST_SYSTEM_PROMPT in chat_format.decode(default_call.request.prompt_token_ids)


async def test_help_explains_mode_and_why_a_persona_cannot_change(start_service: Any) -> None:
    service: Service = await start_service(personas=PERSONAS)
    assert await service.post(command_with_args("help", "")) == 200
    assert await notice(service, 1) == HELP_TEXT
    assert "/mode NAME" in HELP_TEXT and "cannot change mid-conversation" in HELP_TEXT
