"""Signed webhooks: one ``[[webhooks]]`` table an integration, replies by signed callback."""

from bot.channels.kind import ChannelKind
from bot.channels.webhook.settings import WebhookSettings

CHANNEL = ChannelKind("webhook", __name__, section="webhooks", table=WebhookSettings)
