"""``botctl telegram ...``: register, inspect and remove a bot's webhook.

The service's configuration is a file, so ``set-webhook`` cannot store the
secret it registers: it prints the line to put in the bot's ``[[telegram]]``
table. Until the service runs with that secret, it refuses Telegram's
deliveries with 401 and Telegram keeps them and retries, so nothing is lost;
``--keep-secret`` re-registers with the configured secret instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
from typing import Any

import aiohttp
import click

from bot.channels.telegram.api import TelegramApi, TelegramApiError
from bot.channels.telegram.doctor import webhook_url
from bot.channels.telegram.payloads import HANDLED_UPDATE_TYPES
from bot.channels.telegram.settings import TelegramBotSettings
from bot.cli.common import Context

SECRET_BYTES = 32
"""``token_urlsafe(32)``: 43 characters of ``A-Za-z0-9_-``, what Telegram allows in a secret."""
CLI_RETRY_BUDGET_S = 10.0
"""How long a command keeps trying a call that fails for a passing reason."""


def _bot(ctx: click.Context, name: str) -> TelegramBotSettings:
    # botctl's root context carries the loaded settings; standalone, load the defaults.
    settings = (ctx.find_root().obj or Context(None)).settings
    bots = {bot.name: bot for bot in settings.telegram}
    if name not in bots:
        known = ", ".join(sorted(bots)) or "none configured"
        raise click.ClickException(f"no [[telegram]] bot named {name!r} (known: {known})")
    return bots[name]


def _call(bot: TelegramBotSettings, method: str, params: dict[str, Any] | None = None) -> Any:
    async def run() -> Any:
        async with aiohttp.ClientSession() as http:
            api = TelegramApi.from_settings(http, bot)
            # An operator waits at the terminal: a short budget, not a reply's.
            return await api.call(method, params, retry=api.new_retry(CLI_RETRY_BUDGET_S))

    try:
        return asyncio.run(run())
    except TelegramApiError as exc:
        raise click.ClickException(f"{exc} ({exc.error_class.value})") from None


@click.group()
def telegram() -> None:
    """Telegram bots: webhook registration."""


@telegram.command("set-webhook")
@click.argument("bot")
@click.option("--url", "public_url", required=True, help="Public HTTPS base URL of the service.")
@click.option("--keep-secret", is_flag=True, help="Re-use the configured secret_token.")
@click.option("--drop-pending-updates", is_flag=True, help="Discard updates Telegram holds.")
@click.pass_context
def set_webhook(
    ctx: click.Context, bot: str, public_url: str, keep_secret: bool, drop_pending_updates: bool
) -> None:
    """Point BOT's webhook at this service, with a secret header it must carry."""
    settings = _bot(ctx, bot)
    if keep_secret:
        if settings.secret_token is None:
            raise click.ClickException(f"bot {bot!r} has no secret_token configured to keep")
        secret = settings.secret_token.get_secret_value()
    else:
        secret = secrets.token_urlsafe(SECRET_BYTES)
    url = webhook_url(public_url, bot)
    _call(
        settings,
        "setWebhook",
        {
            "url": url,
            "secret_token": secret,
            "allowed_updates": list(HANDLED_UPDATE_TYPES),
            "drop_pending_updates": drop_pending_updates,
        },
    )
    click.echo(f"webhook of bot {bot!r} set to {url}")
    if keep_secret:
        return
    click.echo(
        f'\nPut this line in the [[telegram]] table with name = "{bot}" and restart the service\n'
        "(until then it refuses Telegram's deliveries, which Telegram keeps and retries):\n"
    )
    click.echo(f'secret_token = "{secret}"')


@telegram.command("webhook-info")
@click.argument("bot")
@click.option(
    "--json", "as_json", is_flag=True, help="Telegram's WebhookInfo as one JSON document."
)
@click.pass_context
def webhook_info(ctx: click.Context, bot: str, as_json: bool) -> None:
    """Show where Telegram delivers BOT's updates, and its last delivery error."""
    settings = _bot(ctx, bot)
    info = _call(settings, "getWebhookInfo")
    if as_json:
        document = {**info, "secret_token_configured": settings.secret_token is not None}
        click.echo(json.dumps(document))
        return
    click.echo(f"url: {info.get('url') or '(none: no webhook set)'}")
    click.echo(f"pending_update_count: {info.get('pending_update_count', 0)}")
    for key in ("ip_address", "max_connections", "allowed_updates", "last_error_message"):
        if key in info:
            click.echo(f"{key}: {info[key]}")
    if "last_error_date" in info:
        when = dt.datetime.fromtimestamp(int(info["last_error_date"]), dt.UTC)
        click.echo(f"last_error_date: {when.isoformat()}")
    configured = "yes" if settings.secret_token is not None else "no"
    click.echo(f"secret_token configured here: {configured}")


@telegram.command("delete-webhook")
@click.argument("bot")
@click.option("--drop-pending-updates", is_flag=True, help="Discard updates Telegram holds.")
@click.pass_context
def delete_webhook(ctx: click.Context, bot: str, drop_pending_updates: bool) -> None:
    """Stop Telegram delivering BOT's updates to any webhook."""
    settings = _bot(ctx, bot)
    _call(settings, "deleteWebhook", {"drop_pending_updates": drop_pending_updates})
    click.echo(f"webhook of bot {bot!r} deleted")
