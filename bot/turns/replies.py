"""What the turn pipeline needs from a channel: a sink per turn that delivers the reply.

Channels implement these; the pipeline only ever sees these types, so it knows
nothing of HTTP or of any platform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from bot.errors import ErrorClass


@dataclass(frozen=True)
class TurnAddress:
    """What a channel is told when it opens a reply sink for a turn."""

    turn_id: str
    conversation_id: str
    channel: str
    reply_to: dict[str, Any]
    delivery: dict[str, Any] | None = None
    """A turn taken over from a dead worker: where its reply's platform message is, as the
    dead worker's sink told it (``ResumableSink``). Its sink edits that message on."""


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


@runtime_checkable
class ResumableSink(Protocol):
    """A sink whose platform message another worker can go on editing if this one dies.

    ``delivery_state`` is saved with the reply so far (``bot.turns.partials``), and a
    worker that takes the turn over opens its sink with it (``TurnAddress.delivery``):
    that sink then edits the same message, sends nothing twice. JSON, small.
    """

    def delivery_state(self) -> dict[str, Any] | None: ...


def delivery_of(sink: ReplySink) -> dict[str, Any] | None:
    """Where ``sink``'s platform message is now, if another worker could continue it."""
    return sink.delivery_state() if isinstance(sink, ResumableSink) else None


class Channel(Protocol):
    """A messaging platform (or our own API) the service answers on."""

    name: str
    """The prefix served: ``InboundMessage.channel`` is ``name`` or starts with ``name:``."""

    def open_reply(self, address: TurnAddress) -> ReplySink: ...
