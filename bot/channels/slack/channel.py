"""One configured Slack app at run time: its verifier, Web API client, pacing, names.

``SlackChannel`` is the ``Channel`` the turn pipeline sees (``slack:{name}``);
it only opens reply sinks. The inbound side lives in ``routes.py``.
"""

from __future__ import annotations

import aiohttp
from slack_sdk.signature import SignatureVerifier

from bot.channels.base import ReplySink, TurnAddress
from bot.channels.slack.api import SlackApi, make_client
from bot.channels.slack.outbound import Outbound, ReplyTarget
from bot.channels.slack.settings import SlackAppSettings
from bot.channels.slack.sink import SlackReplySink
from bot.channels.slack.users import UserNames

CHANNEL_PREFIX = "slack"


class SlackChannel:
    def __init__(self, settings: SlackAppSettings, session: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.name = f"{CHANNEL_PREFIX}:{settings.name}"
        self.verifier = SignatureVerifier(settings.signing_secret.get_secret_value())
        self.api = SlackApi(make_client(settings, session), timeout_s=settings.api_timeout_s)
        self.outbound = Outbound(self.api, settings)
        self.users = UserNames(
            self.api, ttl_s=settings.user_cache_ttl_s, timeout_s=settings.user_lookup_timeout_s
        )

    def open_reply(self, address: TurnAddress) -> ReplySink:
        return SlackReplySink(
            self.outbound,
            ReplyTarget.from_reply_to(address.reply_to),
            turn_id=address.turn_id,
            delivery=address.delivery,
        )
