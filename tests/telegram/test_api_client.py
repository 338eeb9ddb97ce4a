"""The outbound client against the fake Bot API: errors classified, pacing, 429s, no token leaks."""

from __future__ import annotations

import itertools
import time

import aiohttp
import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from bot.channels.telegram.api import TelegramApi, TelegramApiError
from bot.channels.telegram.pacing import ChatPacer, PacingPolicy
from bot.errors import ErrorClass
from bot.testing.telegram_api import FakeTelegram
from tests.telegram.conftest import BOT_TOKEN, GROUP_CHAT, PRIVATE_CHAT


async def test_send_message_returns_the_message(
    api: TelegramApi, fake_telegram: FakeTelegram
) -> None:
    result = await api.call("sendMessage", {"chat_id": PRIVATE_CHAT, "text": "hi"})
    assert result["text"] == "hi" and result["chat"]["type"] == "private"
    assert fake_telegram.texts(PRIVATE_CHAT) == ["hi"]


@pytest.mark.parametrize(
    ("error_code", "description", "error_class"),
    [
        (401, "Unauthorized", ErrorClass.AUTH),
        (404, "Not Found", ErrorClass.AUTH),
        (403, "Forbidden: bot was blocked by the user", ErrorClass.DELIVERY),
        (400, "Bad Request: chat not found", ErrorClass.DELIVERY),
        (502, "Bad Gateway", ErrorClass.DELIVERY),
    ],
)
async def test_errors_are_classified(
    api: TelegramApi,
    fake_telegram: FakeTelegram,
    error_code: int,
    description: str,
    error_class: ErrorClass,
) -> None:
    fake_telegram.fail(error_code, description, method="sendMessage")
    with pytest.raises(TelegramApiError) as raised:
        await api.call("sendMessage", {"chat_id": PRIVATE_CHAT, "text": "hi"})
    assert raised.value.error_class is error_class
    assert raised.value.description == description


async def test_revoked_token_is_auth(api: TelegramApi, fake_telegram: FakeTelegram) -> None:
    fake_telegram.revoke(BOT_TOKEN)
    with pytest.raises(TelegramApiError) as raised:
        await api.call("getMe")
    assert raised.value.error_code == 401 and raised.value.error_class is ErrorClass.AUTH


async def test_429_blocks_the_chat_only_and_is_rate_limited(
    api: TelegramApi, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.inject_flood(PRIVATE_CHAT, retry_after=1)
    with pytest.raises(TelegramApiError) as raised:
        await api.call("sendMessage", {"chat_id": PRIVATE_CHAT, "text": "a"})
    assert raised.value.error_class is ErrorClass.RATE_LIMITED
    assert raised.value.retry_after == 1
    assert api.pacer.flooded_for(PRIVATE_CHAT) > 0.5
    # Another chat is not held back.
    started = time.monotonic()
    await api.call("sendMessage", {"chat_id": GROUP_CHAT, "text": "b"})
    assert time.monotonic() - started < 0.5
    # The flooded chat's next call waits the penalty out instead of hammering.
    await api.call("sendMessage", {"chat_id": PRIVATE_CHAT, "text": "c"})
    assert time.monotonic() - started >= 0.9
    assert fake_telegram.flood_violations == []


async def test_retry_flood_waits_and_delivers(
    api: TelegramApi, fake_telegram: FakeTelegram
) -> None:
    fake_telegram.inject_flood(PRIVATE_CHAT, retry_after=1)
    result = await api.call(
        "sendMessage", {"chat_id": PRIVATE_CHAT, "text": "final"}, retry=True
    )
    assert result["text"] == "final"
    assert [call.ok for call in fake_telegram.calls_of("sendMessage")] == [False, True]
    assert fake_telegram.flood_violations == []


async def test_a_flood_wait_longer_than_allowed_gives_up(
    http: aiohttp.ClientSession, fake_telegram: FakeTelegram
) -> None:
    api = TelegramApi(
        http,
        token=SecretStr(BOT_TOKEN),
        base_url=fake_telegram.base_url,
        pacer=ChatPacer(PacingPolicy(0.0, 0.0, 1000.0)),
        timeout_s=5,
        max_flood_wait_s=2,
    )
    fake_telegram.inject_flood(PRIVATE_CHAT, retry_after=3600)
    started = time.monotonic()
    with pytest.raises(TelegramApiError) as raised:
        await api.call("sendMessage", {"chat_id": PRIVATE_CHAT, "text": "x"}, retry=True)
    assert raised.value.retry_after == 3600
    assert time.monotonic() - started < 1


async def test_calls_to_one_chat_are_paced(api: TelegramApi, fake_telegram: FakeTelegram) -> None:
    for index in range(4):
        await api.call("sendMessage", {"chat_id": GROUP_CHAT, "text": f"m{index}"})
    times = [call.at for call in fake_telegram.calls_of("sendMessage")]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Group interval 0.16 s in the test settings, kept at sending; arrival times carry the
    # loopback's jitter (a loaded machine delayed one call's arrival by 85 ms).
    assert times[-1] - times[0] >= 3 * 0.16 - 0.03, gaps
    assert min(gaps) >= 0.05, gaps
    assert all(call.ok for call in fake_telegram.calls)


async def test_the_token_never_reaches_errors_or_logs(
    http: aiohttp.ClientSession, fake_telegram: FakeTelegram
) -> None:
    unreachable = TelegramApi(
        http,
        token=SecretStr(BOT_TOKEN),
        base_url="http://127.0.0.1:9",  # discard port: nothing listens
        pacer=ChatPacer(PacingPolicy(0.0, 0.0, 1000.0)),
        timeout_s=5,
        max_flood_wait_s=0,
    )
    with capture_logs() as logs:
        with pytest.raises(TelegramApiError) as network:
            await unreachable.call("sendMessage", {"chat_id": 1, "text": "x"})
        fake_telegram.inject_flood(PRIVATE_CHAT, retry_after=1)
        good = TelegramApi(
            http,
            token=SecretStr(BOT_TOKEN),
            base_url=fake_telegram.base_url,
            pacer=ChatPacer(PacingPolicy(0.0, 0.0, 1000.0)),
            timeout_s=5,
            max_flood_wait_s=0,
        )
        with pytest.raises(TelegramApiError) as flood:
            await good.call("sendMessage", {"chat_id": PRIVATE_CHAT, "text": "x"})
    assert network.value.error_class is ErrorClass.NETWORK
    secret = BOT_TOKEN.split(":")[1]
    for text in (str(network.value), repr(network.value), str(flood.value), repr(logs)):
        assert secret not in text
    assert network.value.__cause__ is None and network.value.__suppress_context__
