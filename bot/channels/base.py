"""The one small interface every messaging channel implements.

A channel turns a platform's inbound request into an ``InboundMessage`` (the
HTTP handler verifies, parses and hands it to ``TurnService.accept``), and
opens a ``ReplySink`` per turn to deliver the reply. Both types belong to the
turn pipeline (``bot.turns.inbound``, ``bot.turns.replies``), which knows
nothing of HTTP or of any platform; they are named here for the channels.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.errors import ErrorClass
from bot.turns.inbound import InboundMessage
from bot.turns.replies import Channel, ReplySink, TurnAddress, UsageAwareSink

__all__ = [
    "Channel",
    "InboundMessage",
    "ReplySink",
    "SilentChannel",
    "SilentReplySink",
    "TurnAddress",
    "UsageAwareSink",
]


@dataclass
class SilentChannel:
    """A channel whose clients read the reply from the turn's stream (the HTTP API's
    event stream, the OpenAI API's HTTP answer): its sinks send nothing."""

    name: str

    def open_reply(self, address: TurnAddress) -> ReplySink:
        return SilentReplySink()


class SilentReplySink:
    """The sink of a channel whose client reads the reply elsewhere (the turn's stream,
    the HTTP response it is answered on) or was already answered: it sends nothing."""

    async def start(self) -> None:
        return None

    async def delta(self, text_so_far: str) -> None:
        return None

    async def finish(self, text: str) -> None:
        return None

    async def fail(self, error_class: ErrorClass, user_message: str) -> None:
        return None
