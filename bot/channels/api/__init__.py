"""The service's own HTTP API (``/v1/messages``, turns, conversations) as a channel."""

from bot.channels.kind import ChannelKind

CHANNEL: ChannelKind[None] = ChannelKind("api", __name__)
