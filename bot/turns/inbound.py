"""A user message as the turn pipeline receives it, whatever channel it came from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


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
