"""The Slack app manifest: everything a Slack app needs to talk to this service, in one document.

Pasted into Slack's "Create New App -> From an app manifest" (or an existing
app's "App Manifest" page), it sets what is otherwise a dozen clicks: the bot
user, the slash commands and their Request URL, the OAuth scopes, the event
subscriptions, and the App Home's messages tab (without it users cannot DM the
bot). ``botctl slack manifest --url https://HOST`` prints it for a public URL;
``deploy/slack-app-manifest.json`` is the same document for a placeholder host.

Fields follow Slack's manifest schema, version 1 (``_metadata.major_version``),
the one ordinary (non-hosted) apps use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bot.channels.access import GroupPolicy

EVENTS_PATH = "/slack/events"
COMMANDS_PATH = "/slack/commands"
DEFAULT_APP_NAME = "LLM chat bot"
APP_DESCRIPTION = "A self-hosted LLM: DM it, or mention it in a channel."


@dataclass(frozen=True)
class SlashCommand:
    command: str
    description: str
    usage_hint: str | None = None


SLASH_COMMANDS: tuple[SlashCommand, ...] = (
    SlashCommand("/new", "Start a new conversation (in a DM with the bot)"),
    SlashCommand("/stop", "Stop the reply being written (in a DM)"),
    SlashCommand("/retry", "Answer your last message again (in a DM)"),
    SlashCommand(
        "/mode", "List personas, or start a new conversation with one (in a DM)", "[name]"
    ),
    SlashCommand("/stats", "Your messages and tokens today; all: every user's (admins)", "[all]"),
)
"""Every command ``bot.channels.slack.commands`` answers, as Slack shows it in the composer."""

BOT_SCOPES = (
    "app_mentions:read",  # app_mention events: mentions in channels
    "chat:write",  # replies: chat.postMessage, chat.update, chat.*Stream
    "commands",  # the slash commands
    "im:history",  # message.im events: direct messages
    "users:read",  # users.info: the sender's name, shown to the model in channels
)
CHANNEL_MESSAGE_SCOPES = ("channels:history", "groups:history")
"""With ``channels = "all"``: every message of the channels the bot is in, not only mentions."""


def app_manifest(
    public_url: str, *, name: str = DEFAULT_APP_NAME, channels: GroupPolicy = "mention"
) -> dict[str, Any]:
    """The manifest for a service reachable at ``public_url`` (``https://bot.example.com``).

    ``channels`` is the app's ``[[slack]]`` setting of the same name: ``all`` subscribes to
    every channel message (and asks for the scopes to read them) instead of mentions.
    """
    base = public_url.rstrip("/")
    every_message = channels == "all"
    bot_events = ["message.channels", "message.groups"] if every_message else ["app_mention"]
    scopes = [*BOT_SCOPES, *(CHANNEL_MESSAGE_SCOPES if every_message else ())]
    commands: list[dict[str, Any]] = []
    for slash in SLASH_COMMANDS:
        entry: dict[str, Any] = {
            "command": slash.command,
            "url": f"{base}{COMMANDS_PATH}",
            "description": slash.description,
            "should_escape": False,
        }
        if slash.usage_hint is not None:
            entry["usage_hint"] = slash.usage_hint
        commands.append(entry)
    return {
        "_metadata": {"major_version": 1, "minor_version": 1},
        "display_information": {"name": name, "description": APP_DESCRIPTION},
        "features": {
            "app_home": {
                "home_tab_enabled": False,
                "messages_tab_enabled": True,
                "messages_tab_read_only_enabled": False,
            },
            "bot_user": {"display_name": name, "always_online": True},
            "slash_commands": commands,
        },
        "oauth_config": {"scopes": {"bot": sorted(scopes)}},
        "settings": {
            "event_subscriptions": {
                "request_url": f"{base}{EVENTS_PATH}",
                "bot_events": [*bot_events, "message.im"],
            },
            "interactivity": {"is_enabled": False},
            "org_deploy_enabled": False,
            "socket_mode_enabled": False,
            "token_rotation_enabled": False,
        },
    }


def render(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
