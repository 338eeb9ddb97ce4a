"""Our own HTTP API (``/v1/messages`` ...) as a kind of channel: one, with no table of its own."""

from __future__ import annotations

from bot.channels.kind import ChannelKind

API: ChannelKind[None] = ChannelKind("api")
