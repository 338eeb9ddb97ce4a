"""Who may talk to a chat bot: allow-list, admins, and where it answers in groups.

Each Telegram bot and Slack app has its own lists (``[[telegram]]`` / ``[[slack]]``
tables); this module holds what they share: the policy type, the check, and
the notices. A refusal is always a short notice in the chat, never silence and
never a stored turn: nothing of a refused delivery is written to the database
(not even its inbound event: a stranger's messages must not cost a write each).
Redeliveries of a refused message get no second notice from this process
(``TurnService.decline`` and the Telegram command memory remember the delivery).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from bot.errors import ErrorClass

GroupPolicy = Literal["off", "mention", "all"]
"""Group chats and channels: ``off`` refuses with a notice, ``mention`` answers messages
addressed to the bot (a mention, a reply to it, a command), ``all`` answers every message."""

REFUSAL_CLASS = ErrorClass.BAD_REQUEST
"""How a refusal is delivered (``TurnService.decline``). Not ``auth``: to a sink that means
the bot's own token failed, and it sends nothing."""
NOT_ALLOWED_TEXT = "Sorry, I only talk to people this bot's operator has allowed."
GROUPS_OFF_TEXT = "I do not answer in group chats here: send me a direct message instead."


def listed(entries: Iterable[str], *keys: str | None) -> bool:
    """Whether any of ``keys`` (a user id, a lower-cased username) is among ``entries``."""
    present = {key for key in keys if key}
    return any(entry in present for entry in entries)


def may_talk(allowed: list[str], admins: list[str], *keys: str | None) -> bool:
    """Everyone when the allow-list is empty; else its members and the admins."""
    return not allowed or listed(allowed, *keys) or listed(admins, *keys)
