"""The ids platforms and clients send, checked for shape and length before anything is stored.

Every id ends up in a column of fixed width: ``inbound_events.event_id`` and
``conversations.external_key`` hold 400 characters, ``turns.user_id``,
``turns.user_name`` and ``conversations.owner`` 200, a fair-use subject 300.
PostgreSQL refuses a longer value with an error (SQLite stores it), which
surfaced as a 500: a 4,000-digit Telegram ``update_id`` did. So each channel
checks its ids where it parses them, against what the platform itself sends,
and answers as that platform expects: the HTTP API and the generic webhook with
a 400 and the reason, Slack with a 400 (a malformed event) or, for a slash
command, the help text, Telegram with a 400 for an update without a usable
``update_id`` and, for any other id out of range, an update acknowledged and
ignored (anything but a 2xx makes Telegram redeliver it for hours).
"""

from __future__ import annotations

import re
from typing import Any

ID_MAX = 200
"""The longest conversation, message or user id an HTTP client may send (API, webhook)."""

NAME_MAX = 128
"""A display name (Telegram first + last name, a chat's title, a Slack name) is cut to this:
the platforms' own limits are lower (Telegram: 64 characters a name, 128 a title)."""

TELEGRAM_ID_BITS = 64
"""Telegram's ids fit a signed 64-bit integer (the Bot API: chat and user ids have at
most 52 significant bits; update and message ids are 32-bit)."""
_TELEGRAM_ID_LIMIT = 2 ** (TELEGRAM_ID_BITS - 1)

SLACK_ID_MAX = 64
"""Slack's ids (``T0123ABCD``, ``C…``, ``U…``, ``Ev…``, ``A…``) and timestamps
(``1700000000.000100``) are a few dozen characters at most."""
_SLACK_ID = re.compile(rf"[A-Za-z0-9._-]{{1,{SLACK_ID_MAX}}}")
_SLACK_TEAM = re.compile(rf"[A-Z0-9]{{1,{SLACK_ID_MAX}}}")


def telegram_id(value: Any) -> int | None:
    """``value`` if it is an id Telegram could send (an integer of at most 64 bits)."""
    # bool is an int to Python; JSON's true is no id.
    if type(value) is not int or not -_TELEGRAM_ID_LIMIT <= value < _TELEGRAM_ID_LIMIT:
        return None
    return value


def slack_id(value: Any) -> str | None:
    """``value`` if it has the shape of a Slack id or timestamp, else None."""
    return value if isinstance(value, str) and _SLACK_ID.fullmatch(value) else None


def slack_team_id(value: Any) -> str | None:
    """``value`` if it has the shape of a Slack team id (the workspace, and its tenant:
    upper-case letters and digits, so never ``key:…``, ``bot.turns.owners``)."""
    return value if isinstance(value, str) and _SLACK_TEAM.fullmatch(value) else None


def clip_name(name: str | None) -> str | None:
    """A display name as stored: at most ``NAME_MAX`` characters."""
    if name is None or len(name) <= NAME_MAX:
        return name
    return name[: NAME_MAX - 1] + "…"
