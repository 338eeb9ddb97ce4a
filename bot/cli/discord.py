"""``botctl discord ...``: register a bot's slash commands with Discord.

``register-commands`` overwrites the application's global commands with
this bot's list (``bot.channels.discord.commands.COMMANDS``) in one call
(``PUT /applications/{id}/commands``), so running it again is harmless and
a command removed from the list disappears from Discord. Global commands can
take a while to show in every server; ``--guild ID`` registers them in one
server instead, where they show at once (for trying a bot out).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import click

from bot.channels.discord.api import Call, DiscordApi, DiscordCallError
from bot.channels.discord.commands import COMMANDS
from bot.channels.discord.settings import DiscordBotSettings
from bot.cli.common import Context


def _bot(ctx: click.Context, name: str) -> DiscordBotSettings:
    settings = (ctx.find_root().obj or Context(None)).settings
    bots = {bot.name: bot for bot in settings.discord}
    if name not in bots:
        known = ", ".join(sorted(bots)) or "none configured"
        raise click.ClickException(f"no [[discord]] bot named {name!r} (known: {known})")
    return bots[name]


def registration_call(bot: DiscordBotSettings, guild_id: str | None) -> Call:
    path = f"/applications/{bot.application_id}/commands"
    route = "/applications/{application_id}/commands"
    if guild_id is not None:
        path = f"/applications/{bot.application_id}/guilds/{guild_id}/commands"
        route = "/applications/{application_id}/guilds/{guild_id}/commands"
    return Call("PUT", route, path, bot.application_id, json=COMMANDS)


@click.group()
def discord() -> None:
    """Discord bots: slash command registration."""


@discord.command("register-commands")
@click.argument("bot")
@click.option("--guild", "guild_id", help="Register in this server only (shows at once).")
@click.pass_context
def register_commands(ctx: click.Context, bot: str, guild_id: str | None) -> None:
    """Register BOT's slash commands (/ask, /new, /stop, /stats, /help) with Discord."""
    settings = _bot(ctx, bot)
    if guild_id is not None and not guild_id.isdigit():
        raise click.ClickException("--guild is a server id: digits only")

    async def run() -> Any:
        async with aiohttp.ClientSession() as http:
            return await DiscordApi(http, settings).send(registration_call(settings, guild_id))

    try:
        registered = asyncio.run(run())
    except DiscordCallError as exc:
        raise click.ClickException(f"{exc} ({exc.error_class.value})") from None
    names = [c.get("name") for c in registered if isinstance(c, dict)] if registered else []
    where = f"server {guild_id}" if guild_id else "every server (may take a while to show)"
    click.echo(f"registered {', '.join('/' + str(n) for n in names)} in {where}")
