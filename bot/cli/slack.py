"""``botctl slack manifest``: print the Slack app manifest for this service's public URL."""

from __future__ import annotations

from typing import get_args
from urllib.parse import urlsplit

import click

from bot.channels.access import GroupPolicy
from bot.channels.slack.manifest import DEFAULT_APP_NAME, app_manifest, render
from bot.cli.common import Context


@click.group()
def slack() -> None:
    """Slack apps: the manifest that sets one up.

    \b
    Example:
      botctl slack manifest --url https://bot.example.com > manifest.json
    """


@slack.command("manifest")
@click.option(
    "--url",
    "public_url",
    help="The service's public HTTPS base URL (default: server.public_url).",
)
@click.option("--name", default=DEFAULT_APP_NAME, show_default=True, help="The app's name.")
@click.option(
    "--channels",
    type=click.Choice(["mention", "all"]),
    default="mention",
    show_default=True,
    help="What the bot hears in channels (the [[slack]] table's `channels`).",
)
@click.pass_context
def slack_manifest(ctx: click.Context, public_url: str | None, name: str, channels: str) -> None:
    """Print the app manifest (JSON): paste it at api.slack.com/apps -> Create New App ->
    From an app manifest. It sets the bot user, the slash commands, the scopes and the
    event subscriptions, all pointing at URL."""
    if public_url is None:
        settings = (ctx.find_root().obj or Context(None)).settings
        public_url = settings.server.public_url
    if not public_url:
        raise click.UsageError("give --url https://HOST (or set server.public_url)")
    parts = urlsplit(public_url)
    if parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment:
        raise click.BadParameter(
            "Slack sends events and commands only to a public https:// URL "
            "(for a laptop: a tunnel's HTTPS address)",
            param_hint="--url",
        )
    if not 1 <= len(name) <= 35:
        raise click.BadParameter("1 to 35 characters (Slack's limit)", param_hint="--name")
    policy = next(value for value in get_args(GroupPolicy) if value == channels)
    click.echo(render(app_manifest(public_url, name=name, channels=policy)), nl=False)
