"""Reply sinks against the fake Bot API: streaming, pacing, 429s, long replies, failures."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest

from bot.channels.base import ReplySink, TurnAddress
from bot.channels.telegram.api import TelegramApi
from bot.channels.telegram.channel import TelegramChannel
from bot.channels.telegram.settings import TelegramBotSettings
from bot.errors import DeliveryError, ErrorClass
from bot.testing.telegram_api import FakeTelegram
from bot.testing.telegram_html import parse_html
from bot.turns.replies import delivery_of
from tests.telegram.conftest import BOT_TOKEN, GROUP_CHAT, PRIVATE_CHAT

REPLY = "The **capital** of France is Paris. It has been the capital for a long time. " * 3


def open_sink(
    api: TelegramApi, settings: TelegramBotSettings, chat_id: int, thread: int | None = None
) -> ReplySink:
    chat_type = "private" if chat_id > 0 else "supergroup"
    address = TurnAddress(
        turn_id="t1",
        conversation_id="c1",
        channel=settings.channel,
        reply_to={
            "chat_id": chat_id,
            "chat_type": chat_type,
            "message_id": 31,
            "message_thread_id": thread,
        },
    )
    return TelegramChannel(settings, api).open_reply(address)


async def stream(sink: ReplySink, text: str, *, pieces: int = 40, step_s: float = 0.01) -> None:
    """Feed ``text`` the way the engine does: cumulative deltas, then finish."""
    await sink.start()
    size = max(1, len(text) // pieces)
    for end in range(size, len(text) + size, size):
        started = time.monotonic()
        await sink.delta(text[:end])
        assert time.monotonic() - started < 0.05, "delta must return at once"
        await asyncio.sleep(step_s)
    await sink.finish(text)


def rendered_text(text: str) -> str:
    return parse_html(text.replace("**", ""))[0]


async def test_private_chat_types_then_drafts_then_sends(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    sink = open_sink(api, settings, PRIVATE_CHAT)
    await stream(sink, REPLY)

    methods = [call.method for call in fake_telegram.calls]
    assert methods[0] == "sendChatAction"
    assert methods[-1] == "sendMessage" and methods.count("sendMessage") == 1
    drafts = fake_telegram.calls_of("sendMessageDraft")
    assert len(drafts) >= 2
    assert len({call.params["draft_id"] for call in drafts}) == 1
    assert all(call.ok for call in fake_telegram.calls)
    [message] = fake_telegram.messages(PRIVATE_CHAT)
    assert message.text == rendered_text(REPLY).strip()
    assert {entity.type for entity in message.entities} == {"bold"}
    # Paced: drafts the configured interval apart (0.08 s in tests), give or take jitter.
    times = [call.at for call in drafts]
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.05


async def test_group_sends_then_edits_never_identically(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    sink = open_sink(api, settings, GROUP_CHAT)
    await stream(sink, REPLY, pieces=30, step_s=0.02)

    sends = fake_telegram.calls_of("sendMessage")
    edits = fake_telegram.calls_of("editMessageText")
    assert len(sends) == 1 and len(edits) >= 1
    assert sends[0].params["reply_parameters"]["message_id"] == 31
    assert all(call.ok for call in fake_telegram.calls), "no refused call (not modified, flood)"
    assert fake_telegram.calls_of("sendMessageDraft") == []
    [message] = fake_telegram.messages(GROUP_CHAT)
    assert message.text == rendered_text(REPLY).strip()


async def test_forum_topic_replies_stay_in_the_topic(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    sink = open_sink(api, settings, GROUP_CHAT, thread=12)
    await stream(sink, "Refunds take five days.", pieces=3)
    [send] = fake_telegram.calls_of("sendMessage")
    assert send.params["message_thread_id"] == 12
    assert fake_telegram.calls_of("sendChatAction")[0].params["message_thread_id"] == 12
    assert fake_telegram.messages(GROUP_CHAT)[0].message_thread_id == 12


@pytest.mark.parametrize("chat_id", [PRIVATE_CHAT, GROUP_CHAT])
async def test_long_replies_continue_in_new_messages(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram, chat_id: int
) -> None:
    paragraph = "Paris is lovely in the spring, and the museums are many. " * 8 + "\n\n"
    long_reply = paragraph * 25  # 11 450 characters; 8 paragraphs (3664) fit in a message
    sink = open_sink(api, settings, chat_id)
    await stream(sink, long_reply, pieces=60, step_s=0.005)

    texts = fake_telegram.texts(chat_id)
    assert len(texts) == 4
    assert all(len(text) <= 4096 for text in texts)
    assert " ".join(texts).split() == long_reply.split(), "nothing lost, nothing repeated"
    assert all(call.ok for call in fake_telegram.calls)


@pytest.mark.parametrize("chat_id", [PRIVATE_CHAT, GROUP_CHAT])
async def test_429_mid_stream_is_waited_out_and_the_reply_arrives_complete(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram, chat_id: int
) -> None:
    sink = open_sink(api, settings, chat_id)
    await sink.start()
    await sink.delta("The capital")
    await fake_telegram.wait_until(
        lambda: any(c.method != "sendChatAction" for c in fake_telegram.calls), what="a first step"
    )
    fake_telegram.inject_flood(chat_id, retry_after=1)
    for end in range(12, len(REPLY), 10):
        await sink.delta(REPLY[:end])
        await asyncio.sleep(0.02)
    await sink.finish(REPLY)

    assert any(call.error_code == 429 for call in fake_telegram.calls)
    assert fake_telegram.flood_violations == [], "nothing was sent to the chat during its penalty"
    assert fake_telegram.texts(chat_id)[-1] == rendered_text(REPLY).strip()


async def test_refused_entities_are_resent_as_plain_text(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.fail(
        400,
        'Bad Request: can\'t parse entities: Unsupported start tag "x" at byte offset 3',
        method="sendMessage",
    )
    sink = open_sink(api, settings, PRIVATE_CHAT)
    await sink.start()
    await sink.finish("Use **bold** here")
    sends = fake_telegram.calls_of("sendMessage")
    assert [call.ok for call in sends] == [False, True]
    assert "parse_mode" not in sends[1].params
    assert fake_telegram.texts(PRIVATE_CHAT) == ["Use **bold** here"]


async def test_cancelled_reply_keeps_the_partial_text_and_says_stopped(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    sink = open_sink(api, settings, GROUP_CHAT)
    await sink.start()
    await sink.delta("Half of an answer")
    await fake_telegram.wait_until(lambda: fake_telegram.texts(GROUP_CHAT) != [], what="first send")
    await sink.fail(ErrorClass.CANCELLED, "Stopped.")
    assert fake_telegram.texts(GROUP_CHAT) == ["Half of an answer\n\nStopped."]


async def test_failure_before_any_text_sends_the_apology(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    sink = open_sink(api, settings, PRIVATE_CHAT)
    await sink.start()
    await sink.fail(ErrorClass.ENGINE_UNAVAILABLE, "Sorry, the assistant is unavailable.")
    assert fake_telegram.texts(PRIVATE_CHAT) == ["Sorry, the assistant is unavailable."]


async def test_revoked_token_fails_delivery_as_auth(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.revoke(BOT_TOKEN)
    sink = open_sink(api, settings, PRIVATE_CHAT)
    with pytest.raises(DeliveryError) as raised:
        await stream(sink, REPLY, pieces=5)
    assert raised.value.error_class is ErrorClass.AUTH
    assert BOT_TOKEN.split(":")[1] not in raised.value.message


async def test_blocked_bot_fails_delivery(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.block(BOT_TOKEN, PRIVATE_CHAT)
    sink = open_sink(api, settings, PRIVATE_CHAT)
    with pytest.raises(DeliveryError) as raised:
        await stream(sink, REPLY, pieces=5)
    assert raised.value.error_class is ErrorClass.DELIVERY
    assert "blocked" in raised.value.message


async def test_empty_reply_still_sends_something(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    sink = open_sink(api, settings, PRIVATE_CHAT)
    await sink.start()
    await sink.finish("  ")
    assert fake_telegram.texts(PRIVATE_CHAT) == ["…"]


async def test_delta_returns_at_once_even_when_telegram_is_slow(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.latency_s = 0.3
    sink = open_sink(api, settings, GROUP_CHAT)
    await sink.start()
    started = time.monotonic()
    for end in range(5, len(REPLY), 5):
        await sink.delta(REPLY[:end])
    assert time.monotonic() - started < 0.1
    await sink.finish(REPLY)
    assert fake_telegram.texts(GROUP_CHAT) == [rendered_text(REPLY).strip()]


def reopen_sink(
    api: TelegramApi, settings: TelegramBotSettings, chat_id: int, sink: ReplySink
) -> ReplySink:
    """The sink a worker taking the turn over opens, from the dead one's saved state."""
    state = delivery_of(sink)
    assert state is not None
    chat_type = "private" if chat_id > 0 else "supergroup"
    address = TurnAddress(
        turn_id="t1",
        conversation_id="c1",
        channel=settings.channel,
        reply_to={"chat_id": chat_id, "chat_type": chat_type, "message_id": 31},
        delivery=json.loads(json.dumps(state)),  # as the row stores it
    )
    return TelegramChannel(settings, api).open_reply(address)


@pytest.mark.parametrize("chat_id", [GROUP_CHAT, PRIVATE_CHAT])
async def test_a_reply_taken_over_goes_on_in_the_same_message(
    api: TelegramApi, settings: TelegramBotSettings, fake_telegram: FakeTelegram, chat_id: int
) -> None:
    """A worker died half-way through a reply: the one that takes the turn over edits the
    message (or draft) the user already sees, and sends the reply once."""
    half = REPLY[: len(REPLY) // 2]
    first = open_sink(api, settings, chat_id)
    await first.start()
    await first.delta(half)
    await fake_telegram.wait_until(
        lambda: any(
            call.ok and call.method in ("sendMessage", "sendMessageDraft")
            for call in fake_telegram.calls_of(chat_id=chat_id)
        )
    )
    await asyncio.sleep(0.3)  # its last push is out; then it dies: nothing more from it
    typing = first._typing  # type: ignore[attr-defined]
    if typing is not None:
        typing.cancel()

    second = reopen_sink(api, settings, chat_id, first)
    await stream(second, REPLY)

    sends = [call for call in fake_telegram.calls_of("sendMessage", chat_id) if call.ok]
    assert len(sends) == 1, [call.params.get("text") for call in sends]
    [message] = fake_telegram.messages(chat_id)
    assert message.text == rendered_text(REPLY).strip()
    if chat_id == PRIVATE_CHAT:
        drafts = fake_telegram.calls_of("sendMessageDraft", chat_id)
        assert len({call.params["draft_id"] for call in drafts}) == 1
    else:
        assert message.edits >= 1
