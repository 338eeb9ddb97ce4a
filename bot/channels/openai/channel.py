"""The OpenAI-compatible API as a channel.

Its clients read the reply from the HTTP response the request is answered on,
which follows the turn's stream: the sink itself has nothing to send.
"""

from __future__ import annotations

from bot.channels.base import ReplySink, TurnAddress
from bot.errors import ErrorClass


class OpenAIReplySink:
    async def start(self) -> None:
        return None

    async def delta(self, text_so_far: str) -> None:
        return None

    async def finish(self, text: str) -> None:
        return None

    async def fail(self, error_class: ErrorClass, user_message: str) -> None:
        return None


class OpenAIChannel:
    name = "openai"

    def open_reply(self, address: TurnAddress) -> ReplySink:
        return OpenAIReplySink()
