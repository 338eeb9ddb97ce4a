"""The OpenAI-compatible API as a channel.

Its clients read the reply from the HTTP response the request is answered on,
which follows the turn's stream: the sink itself has nothing to send.
"""

from __future__ import annotations

from bot.channels.base import ReplySink, SilentReplySink, TurnAddress


class OpenAIChannel:
    name = "openai"

    def open_reply(self, address: TurnAddress) -> ReplySink:
        return SilentReplySink()
