"""Every kind of channel the service answers on, in one list (in the doctor's order).

A new platform is one folder (``bot.channels.kind`` says which files) and one line here.
"""

from __future__ import annotations

from typing import Any

from bot.channels.discord.settings import DiscordBotSettings
from bot.channels.kind import ChannelKind
from bot.channels.slack.settings import SlackAppSettings
from bot.channels.telegram.settings import TelegramBotSettings
from bot.channels.webhook.settings import WebhookSettings

TELEGRAM = ChannelKind("telegram", "telegram", TelegramBotSettings, has_doctor=True)
SLACK = ChannelKind("slack", "slack", SlackAppSettings, has_doctor=True)
DISCORD = ChannelKind("discord", "discord", DiscordBotSettings, has_doctor=True)
WEBHOOK = ChannelKind("webhook", "webhooks", WebhookSettings)
API: ChannelKind[None] = ChannelKind("api")
OPENAI: ChannelKind[None] = ChannelKind("openai")

CHANNELS: list[ChannelKind[Any]] = [TELEGRAM, SLACK, DISCORD, WEBHOOK, API, OPENAI]
