"""One configured webhook integration at run time: the ``Channel`` ``webhook:{name}``."""

from __future__ import annotations

import aiohttp

from bot.channels.base import ReplySink, SilentReplySink, TurnAddress
from bot.channels.webhook.callbacks import CallbackClient
from bot.channels.webhook.settings import WebhookSettings
from bot.channels.webhook.sink import WebhookReplySink

CHANNEL_PREFIX = "webhook"


class WebhookChannel:
    def __init__(self, settings: WebhookSettings, http: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.name = f"{CHANNEL_PREFIX}:{settings.name}"
        self.secret = settings.secret.get_secret_value()
        self.accepted_secrets = [self.secret] + [
            previous.get_secret_value() for previous in settings.previous_secrets
        ]
        """Inbound messages may be signed with any of these (the current one first)."""
        self.callbacks = CallbackClient(settings, http)

    def open_reply(self, address: TurnAddress) -> ReplySink:
        if not address.turn_id:
            # A message refused before it was stored (fair use): the sender got the
            # refusal as the HTTP answer, and there is no turn to call back about.
            return SilentReplySink()
        return WebhookReplySink(
            self.callbacks,
            address,
            webhook=self.settings.name,
            chunk_interval_s=self.settings.chunk_interval_s,
        )
