"""Fixtures of the Telegram channel's tests: the fake Bot API and a client of it."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from bot.channels.telegram.api import TelegramApi
from bot.channels.telegram.settings import TelegramBotSettings
from bot.http.keys import TURNS
from bot.storage.models import Turn
from bot.testing.telegram_api import FakeTelegram
from tests.conftest import MakeClient
from tests.helpers import load_turns

FIXTURES = Path(__file__).parent / "fixtures"
SECRET = "s3cret-Header_value"
HEADER = "X-Telegram-Bot-Api-Secret-Token"
update_ids = itertools.count(700_000_000)
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


def bot_table(fake: FakeTelegram, **overrides: Any) -> dict[str, Any]:
    """The ``[[telegram]]`` table of the test bot, pointed at the fake Bot API."""
    return {
        "name": "testbot",
        "token": BOT_TOKEN,
        "secret_token": SECRET,
        "api_base_url": fake.base_url,
        **FAST_PACING,
        **overrides,
    }


def bot_settings(fake: FakeTelegram, **overrides: Any) -> TelegramBotSettings:
    return TelegramBotSettings(**bot_table(fake, **{"secret_token": None, **overrides}))


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


def private_update(text: str, chat_id: int = PRIVATE_CHAT) -> dict[str, Any]:
    update = copy.deepcopy(load_update("private_text"))
    update["update_id"] = next(update_ids)
    message = update["message"]
    message["message_id"] = update["update_id"] % 100_000
    message["chat"]["id"] = message["from"]["id"] = chat_id
    message["text"] = text
    return update


def fixture_update(name: str) -> dict[str, Any]:
    update = copy.deepcopy(load_update(name))
    update["update_id"] = next(update_ids)
    return update


@dataclass
class Service:
    client: TestClient[Any, Any]
    fake: FakeTelegram
    db_url: str

    async def post(self, update: dict[str, Any], secret: str | None = SECRET) -> int:
        headers = {HEADER: secret} if secret is not None else {}
        response = await self.client.post("/telegram/testbot", json=update, headers=headers)
        return response.status

    async def idle(self) -> None:
        await self.client.app[TURNS].wait_idle(timeout=120)

    async def turns(self) -> list[Turn]:
        return await load_turns(self.db_url)


def command_update(name: str, chat_id: int = PRIVATE_CHAT) -> dict[str, Any]:
    update = private_update(f"/{name}", chat_id)
    update["message"]["entities"] = [{"offset": 0, "length": len(name) + 1, "type": "bot_command"}]
    return update


@pytest.fixture
async def start_service(
    fake_telegram: FakeTelegram, sqlite_url: str, make_client: MakeClient
) -> Any:
    async def start(bot: dict[str, Any] | None = None, **sections: Any) -> Service:
        table = bot_table(fake_telegram, **(bot or {}))
        client = await make_client(sqlite_url, telegram=[table], **sections)
        return Service(client, fake_telegram, sqlite_url)

    return start
