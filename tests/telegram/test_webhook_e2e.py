"""The Telegram channel end to end: real app on loopback, real vLLM engine, fake Bot API."""

from __future__ import annotations

import asyncio
import copy
import itertools
from types import SimpleNamespace
from typing import Any

from click.testing import CliRunner

from bot.channels.retry import NOTHING_TO_RETRY_TEXT
from bot.channels.telegram.commands import (
    EDIT_REFUSED_TEXT,
    HELP_TEXT,
    NEW_TEXT,
    NOTHING_TO_STOP_TEXT,
)
from bot.channels.telegram.render import Renderer
from bot.cli.telegram import telegram
from bot.config import load_settings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from bot.testing.telegram_api import FakeTelegram
from bot.testing.telegram_html import parse_html
from tests.conftest import MakeClient
from tests.engines import MeetingEngine, TrickleEngine
from tests.helpers import count_rows, load_history_rows
from tests.telegram.conftest import (
    BOT_TOKEN,
    GROUP_CHAT,
    HEADER,
    PRIVATE_CHAT,
    SECRET,
    Service,
    bot_table,
    command_update,
    fixture_update,
    private_update,
    update_ids,
)


def expected_texts(reply: str, limit: int = 4096) -> list[str]:
    """What Telegram shows for ``reply``: its chunks, rendered and parsed as Telegram does."""
    renderer = Renderer("html", limit)
    chunks = renderer.split(reply)
    shown = []
    for index in range(len(chunks)):
        rendered = renderer.render(chunks, index)
        if rendered is not None:
            shown.append(parse_html(rendered.text)[0])
    return shown or ["…"]


async def test_secret_header_is_checked_and_nothing_is_stored_without_it(
    start_service: Any,
) -> None:
    service: Service = await start_service()
    update = private_update("hello")
    assert await service.post(update, secret=None) == 401
    assert await service.post(update, secret="wrong") == 401
    assert await service.post(update, secret=SECRET + "x") == 401
    response = await service.client.post(
        "/telegram/otherbot", json=update, headers={HEADER: SECRET}
    )
    assert response.status == 404
    assert set((await count_rows(service.db_url)).values()) == {0}
    assert service.fake.calls == []
    assert await service.post(update) == 200
    await service.idle()
    assert (await count_rows(service.db_url))["turns"] == 1


async def test_private_chat_streams_drafts_then_sends_the_reply(start_service: Any) -> None:
    service: Service = await start_service()
    assert await service.post(private_update("Tell me about Paris")) == 200
    await service.idle()

    [turn] = await service.turns()
    assert turn.status == "done", turn.error_message
    assert turn.user_name is None
    fake = service.fake
    assert fake.calls[0].method == "sendChatAction"
    assert fake.calls_of("sendMessageDraft"), "streamed as drafts"
    assert fake.texts(PRIVATE_CHAT) == expected_texts(turn.reply_text or "")
    assert all(call.ok for call in fake.calls)


async def test_redelivered_update_is_answered_once(start_service: Any) -> None:
    service: Service = await start_service()
    update = private_update("Are you there?")
    statuses = await asyncio.gather(*(service.post(update) for _ in range(3)))
    assert statuses == [200, 200, 200]
    await service.idle()
    assert await service.post(update) == 200  # a late retry, after the reply
    await service.idle()

    assert len(await service.turns()) == 1
    assert len(service.fake.calls_of("sendMessage")) == 1


async def test_messages_in_one_chat_are_answered_in_order(start_service: Any) -> None:
    service: Service = await start_service()
    for text in ("first question", "second question", "third question"):
        assert await service.post(private_update(text)) == 200
    await service.idle()

    turns = sorted(await service.turns(), key=lambda turn: turn.seq)
    assert [turn.user_text for turn in turns] == [
        "first question",
        "second question",
        "third question",
    ]
    assert all(turn.status == "done" for turn in turns)
    for before, after in itertools.pairwise(turns):
        assert after.started_at is not None and before.finished_at is not None
        assert after.started_at >= before.finished_at
    expected = [text for turn in turns for text in expected_texts(turn.reply_text or "")]
    assert service.fake.texts(PRIVATE_CHAT) == expected


async def test_chats_are_answered_concurrently(
    fake_telegram: FakeTelegram, sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    # The engine starts no request before all three chats' are waiting for it: a service
    # that answered one chat at a time would time out on the first and fail it.
    client = await make_client(
        sqlite_url, telegram=[bot_table(fake_telegram)], engine_override=MeetingEngine(engine, 3)
    )
    service = Service(client, fake_telegram, sqlite_url)
    chats = [PRIVATE_CHAT + offset for offset in range(3)]
    await asyncio.gather(*(service.post(private_update("hello there", chat)) for chat in chats))
    await service.idle()

    turns = await service.turns()
    assert len({turn.conversation_id for turn in turns}) == 3
    assert [turn.status for turn in turns] == ["done"] * 3
    for chat in chats:
        assert len(service.fake.texts(chat)) >= 1


async def test_group_answers_only_when_addressed(start_service: Any) -> None:
    service: Service = await start_service()  # no username configured: looked up with getMe
    for name in ("group_not_addressed", "group_mention_other", "group_command_other_bot"):
        assert await service.post(fixture_update(name)) == 200
    await service.idle()
    assert (await count_rows(service.db_url))["turns"] == 0
    assert service.fake.texts(GROUP_CHAT) == []

    assert await service.post(fixture_update("group_mention")) == 200
    assert await service.post(fixture_update("group_reply_to_bot")) == 200
    await service.idle()

    turns = sorted(await service.turns(), key=lambda turn: turn.seq)
    assert [(turn.user_name, turn.user_text) for turn in turns] == [
        ("Bob", "who wrote Moby-Dick?"),
        ("Bob", "And when was it published?"),
    ]
    assert len({turn.conversation_id for turn in turns}) == 1
    sends = service.fake.calls_of("sendMessage", GROUP_CHAT)
    assert [call.params["reply_parameters"]["message_id"] for call in sends[:1]] == [901]
    assert service.fake.calls_of("sendMessageDraft") == []
    expected = [text for turn in turns for text in expected_texts(turn.reply_text or "")]
    assert service.fake.texts(GROUP_CHAT) == expected
    assert len(service.fake.calls_of("getMe")) == 1, "the username is looked up once"
    assert all(call.ok for call in service.fake.calls)


async def test_reply_arrives_complete_through_429s(start_service: Any) -> None:
    service: Service = await start_service()
    service.fake.inject_flood(PRIVATE_CHAT, retry_after=1)
    assert await service.post(private_update("Tell me a story")) == 200
    await service.idle()

    [turn] = await service.turns()
    assert turn.status == "done"
    assert any(call.error_code == 429 for call in service.fake.calls)
    assert service.fake.flood_violations == []
    assert service.fake.texts(PRIVATE_CHAT) == expected_texts(turn.reply_text or "")


async def test_long_replies_continue_in_new_messages(start_service: Any) -> None:
    service: Service = await start_service(
        {"max_message_chars": 64}, generation={"max_tokens": 400}
    )
    assert await service.post(private_update("Write at length")) == 200
    await service.idle()

    [turn] = await service.turns()
    texts = service.fake.texts(PRIVATE_CHAT)
    assert len(texts) >= 2
    assert texts == expected_texts(turn.reply_text or "", 64)


async def test_stop_cancels_the_reply_being_written(start_service: Any) -> None:
    service: Service = await start_service(generation={"max_tokens": 600})
    assert await service.post(private_update("Say a lot")) == 200
    await service.fake.wait_until(
        lambda: bool(service.fake.calls_of("sendMessageDraft")), what="the reply to stream"
    )
    assert await service.post(command_update("stop")) == 200
    await service.idle()

    [turn] = await service.turns()
    assert (turn.status, turn.error_class) == ("failed", "cancelled")
    texts = service.fake.texts(PRIVATE_CHAT)
    assert texts[-1].endswith("Stopped.")
    assert NOTHING_TO_STOP_TEXT not in texts

    assert await service.post(command_update("stop")) == 200
    await service.fake.wait_until(
        lambda: service.fake.texts(PRIVATE_CHAT)[-1] == NOTHING_TO_STOP_TEXT, what="notice"
    )


async def test_new_starts_a_fresh_conversation(start_service: Any) -> None:
    service: Service = await start_service()
    assert await service.post(private_update("remember me")) == 200
    await service.idle()
    new = command_update("new")
    assert await service.post(new) == 200
    assert await service.post(new) == 200  # redelivered: one notice
    assert await service.post(private_update("who am I?")) == 200
    await service.idle()
    await service.fake.wait_until(lambda: NEW_TEXT in service.fake.texts(PRIVATE_CHAT))

    first, second = sorted(await service.turns(), key=lambda turn: turn.created_at)
    assert first.conversation_id != second.conversation_id
    assert service.fake.texts(PRIVATE_CHAT).count(NEW_TEXT) == 1


async def test_help_and_ignored_updates(start_service: Any) -> None:
    service: Service = await start_service()
    for name in ("callback_query", "my_chat_member", "channel_post", "unknown_future_type"):
        assert await service.post(fixture_update(name)) == 200
    assert await service.post(command_update("help")) == 200
    await service.fake.wait_until(lambda: service.fake.texts(PRIVATE_CHAT) == [HELP_TEXT])
    assert (await count_rows(service.db_url))["turns"] == 0


async def test_revoked_token_fails_the_turn_as_auth(start_service: Any) -> None:
    service: Service = await start_service()
    service.fake.revoke(BOT_TOKEN)
    assert await service.post(private_update("hello?")) == 200
    await service.idle()
    [turn] = await service.turns()
    assert (turn.status, turn.error_class) == ("failed", "auth")
    assert BOT_TOKEN not in (turn.error_message or "")


async def test_webhook_admin_commands(
    fake_telegram: FakeTelegram, sqlite_url: str, make_client: MakeClient
) -> None:
    table = bot_table(fake_telegram, secret_token=None)

    async def botctl(*args: str, bot: dict[str, Any] = table) -> str:
        context = SimpleNamespace(settings=load_settings(None, telegram=[bot]))
        result = await asyncio.to_thread(CliRunner().invoke, telegram, list(args), obj=context)
        assert result.exit_code == 0, result.output
        return result.output

    # The service must be reachable before Telegram delivers to it.
    placeholder = await make_client(sqlite_url, telegram=[table])
    public = f"http://127.0.0.1:{placeholder.port}"
    output = await botctl("set-webhook", "testbot", "--url", public)
    [secret_line] = [line for line in output.splitlines() if line.startswith("secret_token = ")]
    secret = secret_line.split('"')[1]
    bot = fake_telegram.bots[BOT_TOKEN]
    assert bot.webhook_url == f"{public}/telegram/testbot"
    assert bot.webhook_secret == secret and len(secret) >= 32
    assert bot.allowed_updates == ["message", "edited_message"]

    # Until the service is configured with the new secret it refuses deliveries...
    assert await fake_telegram.push_update(BOT_TOKEN, private_update("hi")) == 401
    info = await botctl("webhook-info", "testbot")
    assert f"url: {public}/telegram/testbot" in info
    assert "last_error_message: Wrong response from the webhook: 401" in info

    # ... and accepts them once it is.
    await placeholder.close()
    with_secret = {**table, "secret_token": secret}
    configured = await make_client(sqlite_url, telegram=[with_secret])
    public = f"http://127.0.0.1:{configured.port}"  # a new port: register it, same secret
    output = await botctl(
        "set-webhook", "testbot", "--url", public, "--keep-secret", bot=with_secret
    )
    assert "secret_token" not in output and bot.webhook_secret == secret
    assert await fake_telegram.push_update(BOT_TOKEN, private_update("hi")) == 200
    await configured.app[TURNS].wait_idle(timeout=120)
    assert len(fake_telegram.texts(PRIVATE_CHAT)) == 1

    assert "deleted" in await botctl("delete-webhook", "testbot")
    assert bot.webhook_url == "" and bot.webhook_secret is None
    assert "url: (none: no webhook set)" in await botctl("webhook-info", "testbot")


def edit_of(original: dict[str, Any], text: str) -> dict[str, Any]:
    edited = copy.deepcopy(original)
    edited["update_id"] = next(update_ids)
    edited["edited_message"] = edited.pop("message")
    edited["edited_message"]["text"] = text
    edited["edited_message"]["edit_date"] = edited["edited_message"]["date"] + 5
    return edited


async def test_an_edited_last_message_is_answered_on_a_branch_from_before_it(
    start_service: Any,
) -> None:
    service: Service = await start_service()
    hello = private_update("Hello!")
    assert await service.post(hello) == 200
    await service.idle()
    original = private_update("What is the capital of Frnace?")
    assert await service.post(original) == 200
    await service.idle()
    edited = edit_of(original, "What is the capital of France?")
    assert await service.post(edited) == 200
    assert await service.post(edited) == 200  # redelivered: one turn
    await service.idle()

    _, typo, fixed = sorted(await service.turns(), key=lambda turn: turn.seq)
    assert fixed.user_text == "What is the capital of France?"
    assert (fixed.status, fixed.edits_turn_id) == ("done", typo.id)
    assert fixed.reply_to["message_id"] == original["message"]["message_id"]
    # The corrected text follows the first reply, not the answer to the typo.
    rows = await load_history_rows(service.db_url)
    [typo_entry] = [row for row in rows if row.turn_id == typo.id and row.role == "user"]
    [fixed_entry] = [row for row in rows if row.turn_id == fixed.id and row.role == "user"]
    assert typo_entry.parent_seq == fixed_entry.parent_seq
    assert [row.role for row in rows if row.seq == fixed_entry.parent_seq] == ["assistant"]
    assert len(service.fake.texts(PRIVATE_CHAT)) == 3  # three replies, no notice

    # An edit of an older message gets a notice and no turn.
    older = edit_of(hello, "Hi!")
    assert await service.post(older) == 200
    await service.fake.wait_until(
        lambda: service.fake.texts(PRIVATE_CHAT)[-1] == EDIT_REFUSED_TEXT, what="notice"
    )
    await service.idle()
    assert len(await service.turns()) == 3


async def test_retry_answers_the_last_message_again_and_keeps_the_first_reply(
    start_service: Any,
) -> None:
    service: Service = await start_service()
    assert await service.post(command_update("retry")) == 200
    await service.fake.wait_until(
        lambda: service.fake.texts(PRIVATE_CHAT) == [NOTHING_TO_RETRY_TEXT], what="notice"
    )
    assert await service.post(private_update("Tell me a joke.")) == 200
    await service.idle()
    retry = command_update("retry")
    assert await service.post(retry) == 200
    assert await service.post(retry) == 200  # redelivered: one retry
    await service.idle()

    first, again = sorted(await service.turns(), key=lambda turn: turn.seq)
    assert (again.regenerates_turn_id, again.attempt, again.status) == (first.id, 2, "done")
    assert again.user_text == first.user_text
    assert again.prompt_tokens == first.prompt_tokens
    rows = await load_history_rows(service.db_url)
    assert [(row.role, row.parent_seq) for row in rows] == [
        ("user", None),
        ("assistant", 0),
        ("assistant", 0),
    ]
    assert len(service.fake.texts(PRIVATE_CHAT)) == 3  # notice, reply, second reply


async def test_a_message_over_the_length_limit_is_declined_once_with_the_limit(
    start_service: Any,
) -> None:
    service: Service = await start_service(server={"max_text_chars": 100})
    update = private_update("x" * 150)
    assert await service.post(update) == 200
    assert await service.post(update) == 200  # redelivered: one notice
    await service.idle()

    assert (await count_rows(service.db_url))["turns"] == 0
    assert service.fake.texts(PRIVATE_CHAT) == [
        "Sorry, your message is too long for me (150 characters; the limit is 100). "
        "Please shorten it."
    ]


async def test_a_message_over_the_rate_limit_is_told_when_to_come_back(
    start_service: Any,
) -> None:
    service: Service = await start_service(limits={"messages_per_minute": 1, "tokens_per_day": 0})
    assert await service.post(private_update("first")) == 200
    await service.idle()
    assert await service.post(private_update("second")) == 200
    await service.idle()

    [turn] = await service.turns()
    assert turn.user_text == "first" and turn.status == "done"
    texts = service.fake.texts(PRIVATE_CHAT)
    assert texts[:-1] == expected_texts(turn.reply_text or "")
    assert texts[-1].startswith("Sorry, too many messages in a short time. Please try again in")


async def test_stop_reaches_a_reply_written_by_another_worker(
    fake_telegram: FakeTelegram, pg_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    workers = {"poll_interval_s": 0.1}
    writer = Service(
        await make_client(
            pg_url,
            telegram=[bot_table(fake_telegram)],
            # Growing for seconds whatever vLLM merges (SlowEngine pauses per step).
            engine_override=TrickleEngine(engine, 4, 0.05),
            generation={"max_tokens": 600},
            workers=workers,
        ),
        fake_telegram,
        pg_url,
    )
    other = Service(
        await make_client(pg_url, telegram=[bot_table(fake_telegram)], workers=workers),
        fake_telegram,
        pg_url,
    )
    assert await writer.post(private_update("Say a lot")) == 200
    await fake_telegram.wait_until(
        lambda: bool(fake_telegram.calls_of("sendMessageDraft")), what="the reply to stream"
    )
    assert await other.post(command_update("stop")) == 200
    await writer.idle()
    await other.idle()

    [turn] = await writer.turns()
    assert (turn.status, turn.error_class) == ("failed", "cancelled")
    texts = fake_telegram.texts(PRIVATE_CHAT)
    assert texts[-1].endswith("Stopped.")
    assert NOTHING_TO_STOP_TEXT not in texts
