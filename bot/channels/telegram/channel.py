"""The Telegram ``Channel`` of one bot: opens the right reply sink for a turn."""

from __future__ import annotations

from bot.channels.base import ReplySink, TurnAddress
from bot.channels.telegram.api import TelegramApi
from bot.channels.telegram.render import Renderer
from bot.channels.telegram.settings import TelegramBotSettings
from bot.channels.telegram.sink import GroupReplySink, PrivateReplySink, ReplyTarget


class TelegramChannel:
    def __init__(self, settings: TelegramBotSettings, api: TelegramApi) -> None:
        self.name = settings.channel
        self.settings = settings
        self.api = api

    def open_reply(self, address: TurnAddress) -> ReplySink:
        target = ReplyTarget.from_reply_to(address.reply_to)
        sink_class = PrivateReplySink if target.chat_type == "private" else GroupReplySink
        return sink_class(
            self.api,
            target,
            Renderer(self.settings.format, self.settings.max_message_chars),
            typing_refresh_s=self.settings.typing_refresh_s,
            turn_id=address.turn_id,
            delivery=address.delivery,
        )
