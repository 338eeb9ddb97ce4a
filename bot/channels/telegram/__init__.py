"""Telegram bots: one ``[[telegram]]`` table a bot, updates at ``POST /telegram/{name}``."""

from bot.channels.kind import ChannelKind
from bot.channels.telegram.settings import TelegramBotSettings

CHANNEL = ChannelKind(
    "telegram", __name__, section="telegram", table=TelegramBotSettings, has_doctor=True
)
