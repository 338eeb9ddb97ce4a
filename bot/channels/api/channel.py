"""The HTTP API as a channel.

Its readers follow the turn's stream (SSE), so the sink itself has nothing to send.
"""

from __future__ import annotations

from bot.channels.base import ReplySink, TurnAddress
from bot.errors import ErrorClass


class ApiReplySink:
    async def start(self) -> None:
        return None

    async def delta(self, text_so_far: str) -> None:
        return None

    async def finish(self, text: str) -> None:
        return None

    async def fail(self, error_class: ErrorClass, user_message: str) -> None:
        return None


class ApiChannel:
    name = "api"

    def open_reply(self, address: TurnAddress) -> ReplySink:
        return ApiReplySink()
