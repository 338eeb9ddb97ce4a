"""Every channel the service answers on, in one list.

A setup function registers the channel's routes on the app and its
``Channel`` (reply sinks) with the turn service.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
from aiohttp import web

from bot.channels.api import routes as api
from bot.channels.openai import routes as openai_api
from bot.channels.slack import routes as slack
from bot.channels.telegram import routes as telegram
from bot.channels.webhook import routes as webhook
from bot.config import Settings
from bot.turns.service import TurnService
from bot.web import routes as web_page

ChannelSetup = Callable[[web.Application, Settings, TurnService, aiohttp.ClientSession], None]

CHANNEL_SETUPS: list[ChannelSetup] = [
    api.setup,
    openai_api.setup,
    slack.setup,
    telegram.setup,
    webhook.setup,
    web_page.setup,
]
