"""Every kind of channel the service answers on, in one list.

A new platform is one folder (``bot.channels.kind`` says which files) and one line here.
The order is the order of the doctor's checks.
"""

from __future__ import annotations

from typing import Any

from bot.channels import api, openai, slack, telegram, webhook
from bot.channels.kind import ChannelKind

CHANNELS: list[ChannelKind[Any]] = [
    telegram.CHANNEL,
    slack.CHANNEL,
    webhook.CHANNEL,
    api.CHANNEL,
    openai.CHANNEL,
]
