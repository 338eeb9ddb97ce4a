"""``/mode`` on Slack: a signed slash command in the DM starts a fresh conversation with a persona.

Real app and engine (a recording pass-through shows what the engine was asked),
the strict fake Slack Web API for the replies.
"""

from __future__ import annotations

from bot.channels.modes import WHY_FRESH
from bot.channels.slack.commands import MODE_DM_ONLY_TEXT
from bot.engine.vllm_local import LocalVLLMEngine
from bot.testing.slack_api import FakeSlackApi
from bot.turns.chat_format import ChatFormat
from tests.conftest import TEST_SYSTEM_PROMPT, MakeClient
from tests.engine_spy import RecordingEngine
from tests.helpers import PERSONAS, PIRATE_PROMPT, conversations_in, count_rows, load_turns
from tests.slack.conftest import (
    DM_KEY,
    command_form,
    dm_message,
    ephemeral,
    idle,
    in_channel,
    post_command,
    post_event,
    slack_section,
)


async def test_mode_lists_personas_and_starts_a_dm_conversation_with_one(
    slack_api: FakeSlackApi,
    make_client: MakeClient,
    sqlite_url: str,
    engine: LocalVLLMEngine,
    chat_format: ChatFormat,
) -> None:
    spy = RecordingEngine(engine)
    client = await make_client(
        sqlite_url,
        slack=slack_section(slack_api.base_url),
        personas=PERSONAS,
        engine_override=spy,
    )
    await post_event(client, dm_message("Ev2000DM", "1700000100.000300", "hello"))
    await idle(client)

    status, listed = await post_command(client, command_form("/mode", text=""))
    assert status == 200 and listed["response_type"] == "ephemeral"
    assert "pirate - Talks like a pirate" in listed["text"] and "terse" in listed["text"]
    assert WHY_FRESH in listed["text"]

    # The typed name is data: an unknown one is not said back, and changes nothing.
    status, unknown = await post_command(client, command_form("/mode", text="*<!channel>*"))
    assert status == 200 and unknown["text"].startswith("I do not know that persona.")
    assert "<!channel>" not in unknown["text"]
    assert len(await conversations_in(sqlite_url)) == 1

    status, started = await post_command(client, command_form("/mode", text=" Pirate "))
    assert status == 200 and started["text"].startswith("Started a new conversation as pirate.")
    await post_event(client, dm_message("Ev2001DM", "1700000200.000300", "ahoy"))
    await idle(client)

    first, second = await load_turns(sqlite_url)
    assert first.conversation_id != second.conversation_id
    closed, fresh = await conversations_in(sqlite_url)
    assert (closed.persona, fresh.persona) == (None, "pirate")
    assert closed.external_key == fresh.external_key == DM_KEY
    assert fresh.id == second.conversation_id and closed.closed_at is not None
    default_call, pirate_call = spy.calls
    assert TEST_SYSTEM_PROMPT in chat_format.decode(default_call.request.prompt_token_ids)
    pirate_prompt = chat_format.decode(pirate_call.request.prompt_token_ids)
    assert PIRATE_PROMPT in pirate_prompt and TEST_SYSTEM_PROMPT not in pirate_prompt
    assert pirate_call.request.max_tokens == 7


async def test_mode_in_a_channel_points_to_the_dm_and_says_why(
    slack_api: FakeSlackApi, make_client: MakeClient, sqlite_url: str
) -> None:
    client = await make_client(
        sqlite_url, slack=slack_section(slack_api.base_url), personas=PERSONAS
    )
    form = {**in_channel("/mode"), "text": "pirate"}
    assert await post_command(client, form) == (200, ephemeral(MODE_DM_ONLY_TEXT))
    assert set((await count_rows(sqlite_url)).values()) == {0}
