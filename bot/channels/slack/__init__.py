"""Slack apps: one ``[[slack]]`` table an app, Events API and slash commands."""

from bot.channels.kind import ChannelKind
from bot.channels.slack.settings import SlackAppSettings

CHANNEL = ChannelKind("slack", __name__, section="slack", table=SlackAppSettings, has_doctor=True)
