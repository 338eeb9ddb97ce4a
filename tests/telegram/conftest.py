"""Fixtures of the Telegram channel's tests: the fake Bot API and a client of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.channels.telegram.api import TelegramApi
from bot.channels.telegram.settings import TelegramBotSettings
from tests.fakes.telegram_api import FakeTelegram

FIXTURES = Path(__file__).parent.parent / "fixtures" / "telegram"
BOT_TOKEN = "7000000001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
BOT_USERNAME = "TestChatBot"
PRIVATE_CHAT = 111111111
GROUP_CHAT = -1001234567890

# Fast pacing for tests. The fake floods below a quarter of the interval: a client
# that paces as configured never sees a 429 unless a test injects one, with room
# for the scheduling jitter of a busy machine.
FAST_PACING: dict[str, Any] = {
    "private_min_interval_s": 0.08,
    "group_min_interval_s": 0.16,
    "typing_refresh_s": 0.5,
    "max_flood_wait_s": 5.0,
}


def load_update(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


def bot_settings(fake: FakeTelegram, **overrides: Any) -> TelegramBotSettings:
    values: dict[str, Any] = {
        "name": "testbot",
        "token": BOT_TOKEN,
        "api_base_url": fake.base_url,
        **FAST_PACING,
        **overrides,
    }
    return TelegramBotSettings(**values)


@pytest.fixture
async def fake_telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(flood_interval_private_s=0.02, flood_interval_group_s=0.04) as fake:
        fake.add_bot(BOT_TOKEN, BOT_USERNAME)
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def settings(fake_telegram: FakeTelegram) -> TelegramBotSettings:
    return bot_settings(fake_telegram)


@pytest.fixture
def api(http: aiohttp.ClientSession, settings: TelegramBotSettings) -> TelegramApi:
    return TelegramApi.from_settings(http, settings)
