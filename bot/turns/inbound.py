"""A user message as the turn pipeline receives it, whatever channel it came from.

Everything a channel hands in is made storable here (``bot.storage.text``): U+0000
and lone surrogates, which JSON lets any client send and no UTF-8 column (nor
PostgreSQL's ``text``) can hold, become U+FFFD in every text and id before any of
it reaches a statement. Channels that take ids from a client refuse such ids at
the door instead (``bot.http.storable``); this is the rule for every channel.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bot.storage.text import storable, storable_json
from bot.turns.carried import CarriedHistory
from bot.turns.sampling import Sampling


@dataclass(frozen=True)
class InboundMessage:
    """A user message, normalised, ready to be stored and answered."""

    channel: str
    """Channel instance: ``api``, ``telegram:supportbot``, ``slack:T0123``, ``webhook:crm``."""
    event_id: str
    """The platform's id for this delivery; (channel, event_id) is unique: redeliveries dedupe."""
    owner: str
    """The tenant: an API key's owner, a Telegram bot, a Slack workspace.

    Conversations never cross owners."""
    conversation_key: str
    """Stable key of the conversation in the channel, e.g. ``chat:42``, ``C01:thread:1700.1``."""
    text: str
    user_id: str | None = None
    user_name: str | None = None
    """When set, the user turn is shown to the model as ``"{user_name}: {text}"`` (group chats)."""
    reply_to: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable address the channel delivers the reply to (chat id, thread ts, ...)."""
    layer_ms: dict[str, float] = field(default_factory=dict)
    """Ingress-side layer timings measured by the HTTP handler: ``ingress``, ``auth``."""
    received_at: float = field(default_factory=time.time)
    """Wall-clock time the request arrived; TTFT and end-to-end latency count from here."""
    api_key_id: str | None = None
    """The API key that sent it (HTTP API): fair-use limits count per key, else per user."""
    unlimited: bool = False
    """The sender is exempt from fair-use limits (an admin of the bot or app)."""
    persona: str | None = None
    """The persona a conversation this message starts is given (a configured name); a
    conversation that already exists with another persona refuses the message."""
    sampling: Sampling | None = None
    """Sampling parameters its client chose, stored with the turn (``turns.sampling``)."""
    carried: CarriedHistory | None = None
    """The conversation the message comes with, as text (the OpenAI-compatible API): the
    conversation it continues is found from it (``bot.turns.carried``), and
    ``conversation_key`` is not used."""

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, storable(value))
        object.__setattr__(self, "reply_to", storable_json(self.reply_to))


_TEXT_FIELDS = (
    "channel",
    "event_id",
    "owner",
    "conversation_key",
    "text",
    "user_id",
    "user_name",
    "api_key_id",
    "persona",
)
