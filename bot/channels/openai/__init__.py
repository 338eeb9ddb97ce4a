"""The OpenAI-compatible API (chat completions, responses, models) as one more channel."""

from bot.channels.kind import ChannelKind

CHANNEL: ChannelKind[None] = ChannelKind("openai", __name__)
