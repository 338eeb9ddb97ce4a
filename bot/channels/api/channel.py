"""The HTTP API as a channel.

Its readers follow the turn's stream (SSE), so the sink itself has nothing to send.
"""

from __future__ import annotations

from bot.channels.base import ReplySink, SilentReplySink, TurnAddress


class ApiChannel:
    name = "api"

    def open_reply(self, address: TurnAddress) -> ReplySink:
        return SilentReplySink()
