"""The one small interface every messaging channel implements.

A channel turns a platform's inbound request into an ``InboundMessage`` (the
HTTP handler verifies, parses and hands it to ``TurnService.accept``), and
opens a ``ReplySink`` per turn to deliver the reply. Both types belong to the
turn pipeline (``bot.turns.inbound``, ``bot.turns.replies``), which knows
nothing of HTTP or of any platform; they are named here for the channels.
"""

from __future__ import annotations

from bot.turns.inbound import InboundMessage
from bot.turns.replies import Channel, ReplySink, TurnAddress, UsageAwareSink

__all__ = [
    "Channel",
    "InboundMessage",
    "ReplySink",
    "TurnAddress",
    "UsageAwareSink",
    "too_long_notice",
]


def too_long_notice(length: int, limit: int) -> str:
    """What a chat user is told when their message is over ``server.max_text_chars``."""
    return (
        f"Sorry, your message is too long for me ({length:,} characters; "
        f"the limit is {limit:,}). Please shorten it."
    )
