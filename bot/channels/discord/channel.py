"""One configured Discord application at run time: its verifier, API client and sinks.

``DiscordChannel`` is the ``Channel`` the turn pipeline sees (``discord:{name}``);
it opens a reply sink on the interaction's webhook for ``/ask`` and on the
channel for a gateway message. The inbound side lives in ``routes.py`` and
``gateway.py``.
"""

from __future__ import annotations

import aiohttp

from bot.channels.base import ReplySink, TurnAddress
from bot.channels.discord.api import DiscordApi
from bot.channels.discord.deliveries import (
    ChannelDelivery,
    ChannelTarget,
    Delivery,
    InteractionDelivery,
    InteractionTarget,
)
from bot.channels.discord.settings import DiscordBotSettings
from bot.channels.discord.signing import InteractionVerifier
from bot.channels.discord.sink import DiscordReplySink


class DiscordChannel:
    def __init__(self, settings: DiscordBotSettings, http: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.name = settings.channel
        self.verifier = InteractionVerifier(
            settings.public_key, window_s=settings.signature_window_s
        )
        self.api = DiscordApi(http, settings)

    def delivery(self, reply_to: dict[str, object]) -> Delivery:
        if reply_to.get("kind") == "interaction":
            received_at = reply_to.get("received_at")
            return InteractionDelivery(
                self.api,
                InteractionTarget(
                    application_id=self.settings.application_id,
                    token=str(reply_to["token"]),
                    channel_id=str(reply_to["channel_id"]),
                    received_at=float(received_at) if isinstance(received_at, int | float) else 0,
                ),
            )
        return ChannelDelivery(
            self.api,
            ChannelTarget(
                channel_id=str(reply_to["channel_id"]), message_id=str(reply_to["message_id"])
            ),
        )

    def open_reply(self, address: TurnAddress) -> ReplySink:
        delivery = self.delivery(address.reply_to)
        if address.delivery:
            # Taken over from a dead worker: edit the message it was writing.
            delivery.restore(address.delivery)
        return DiscordReplySink(
            delivery,
            max_retry_wait_s=self.settings.max_retry_wait_s,
            turn_id=address.turn_id,
        )
