"""The OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/responses``) as a kind of
channel: one, with no table of its own."""

from __future__ import annotations

from bot.channels.kind import ChannelKind

OPENAI: ChannelKind[None] = ChannelKind("openai")
