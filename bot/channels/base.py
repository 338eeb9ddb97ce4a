"""The one small interface every messaging channel implements.

A channel turns a platform's inbound request into an ``InboundMessage`` (the
HTTP handler verifies, parses and hands it to ``TurnService.accept``), and
opens a ``ReplySink`` per turn to deliver the reply. The turn pipeline only
ever sees these two types: it knows nothing of HTTP or of any platform.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bot.errors import ErrorClass


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


def too_long_notice(length: int, limit: int) -> str:
    """What a chat user is told when their message is over ``server.max_text_chars``."""
    return (
        f"Sorry, your message is too long for me ({length:,} characters; "
        f"the limit is {limit:,}). Please shorten it."
    )


@dataclass(frozen=True)
class TurnAddress:
    """What a channel is told when it opens a reply sink for a turn."""

    turn_id: str
    conversation_id: str
    channel: str
    reply_to: dict[str, Any]


class ReplySink(Protocol):
    """Delivers one turn's reply to its platform.

    ``delta`` is called with the cumulative reply text after every engine
    step: it must return quickly and pace platform calls itself (drop
    intermediate states, keep the latest). ``finish`` awaits full delivery of
    the final text. A sink raises ``bot.errors.DeliveryError`` when it gives up.
    """

    async def start(self) -> None: ...

    async def delta(self, text_so_far: str) -> None: ...

    async def finish(self, text: str) -> None: ...

    async def fail(self, error_class: ErrorClass, user_message: str) -> None: ...


@runtime_checkable
class UsageAwareSink(Protocol):
    """A sink that sends token counts with its final message (the generic webhook does).

    The runner hands it the turn's usage (``prompt_tokens``, ``cached_tokens``,
    ``new_tokens``, ``completion_tokens``) just before ``finish``.
    """

    def set_usage(self, usage: dict[str, int | None]) -> None: ...


class Channel(Protocol):
    """A messaging platform (or our own API) the service answers on."""

    name: str
    """The prefix served: ``InboundMessage.channel`` is ``name`` or starts with ``name:``."""

    def open_reply(self, address: TurnAddress) -> ReplySink: ...
