"""Who the bot answers, and how a message is handed over: the same for ``/ask`` and the gateway.

A refusal (someone the allow-list leaves out, a server channel under
``groups = "off"``) stores nothing: ``/ask`` hears why in its interaction's
ephemeral response, a gateway message in a reply in the chat (only when it
was addressed to the bot: answering chatter would be spam).
"""

from __future__ import annotations

from bot.channels.access import GROUPS_OFF_TEXT, NOT_ALLOWED_TEXT
from bot.channels.discord.payloads import Place
from bot.channels.discord.settings import DiscordBotSettings


def refusal(settings: DiscordBotSettings, place: Place) -> str | None:
    """Why this bot does not answer someone here, if it does not."""
    if not place.is_dm and settings.groups == "off":
        return GROUPS_OFF_TEXT
    if not settings.may_talk(place.user_id):
        return NOT_ALLOWED_TEXT
    return None
