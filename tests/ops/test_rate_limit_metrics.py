"""Platform 429s reach /metrics: the Telegram and Slack clients against their strict fakes."""

from __future__ import annotations

import aiohttp
import pytest

from bot.channels.slack.api import SlackApi, SlackCallError, make_client
from bot.channels.slack.settings import SlackAppSettings
from bot.channels.telegram.api import TelegramApi, TelegramApiError
from bot.channels.telegram.settings import TelegramBotSettings
from bot.ops.metrics import BotMetrics
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from tests.ops.helpers import samples, value

TOKEN = "7000000003:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
CHAT = 4242


async def test_telegram_and_slack_429s_are_counted_per_platform() -> None:
    metrics = BotMetrics()
    unsubscribe = metrics.listen_for_rate_limits()
    try:
        async with FakeTelegram() as fake_tg, aiohttp.ClientSession() as http:
            fake_tg.add_bot(TOKEN, "MetricsBot")
            fake_tg.inject_flood(CHAT, retry_after=1)
            api = TelegramApi.from_settings(
                http, TelegramBotSettings(name="m", token=TOKEN, api_base_url=fake_tg.base_url)
            )
            with pytest.raises(TelegramApiError):
                await api.call("sendMessage", {"chat_id": CHAT, "text": "hi"})

            fake_slack = FakeSlackApi()
            fake_slack.add_workspace("xoxb-m", "T0M")
            await fake_slack.start()
            try:
                fake_slack.fail("auth.test", "ratelimited", times=2, retry_after=1)
                settings = SlackAppSettings(
                    name="m",
                    bot_token="xoxb-m",
                    signing_secret="s",
                    api_base_url=fake_slack.base_url,
                )
                slack = SlackApi(make_client(settings, http), timeout_s=5)
                for _ in range(2):
                    with pytest.raises(SlackCallError):
                        await slack.auth_test()
            finally:
                await fake_slack.close()
    finally:
        unsubscribe()
    values = samples(metrics.render().decode())
    assert value(values, "bot_platform_rate_limited_total", platform="telegram") == 1
    assert value(values, "bot_platform_rate_limited_total", platform="slack") == 2
