"""``botctl telegram webhook-info --json`` against the strict Bot API fake."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from click.testing import CliRunner

from bot.cli.telegram import telegram
from bot.config import load_settings
from bot.testing.telegram_api import FakeTelegram
from tests.telegram.conftest import BOT_TOKEN


async def test_webhook_info_as_json(fake_telegram: FakeTelegram) -> None:
    table = {"name": "testbot", "token": BOT_TOKEN, "api_base_url": fake_telegram.base_url}
    context = SimpleNamespace(settings=load_settings(None, telegram=[table]))

    async def botctl(*args: str) -> Any:
        result = await asyncio.to_thread(CliRunner().invoke, telegram, list(args), obj=context)
        assert result.exit_code == 0, result.output
        return result.stdout

    assert json.loads(await botctl("webhook-info", "testbot", "--json")) == {
        "url": "",
        "has_custom_certificate": False,
        "pending_update_count": 0,
        "secret_token_configured": False,
    }
    await botctl("set-webhook", "testbot", "--url", "https://bot.example.org")
    info = json.loads(await botctl("webhook-info", "testbot", "--json"))
    assert info["url"] == "https://bot.example.org/telegram/testbot"
    assert info["allowed_updates"] == ["message", "edited_message"]
    assert BOT_TOKEN not in json.dumps(info)
