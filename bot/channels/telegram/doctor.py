"""Doctor check of a Telegram bot: its token, and where its webhook points."""

from __future__ import annotations

from typing import Any

import aiohttp

from bot.channels.telegram.api import TelegramApi, TelegramApiError
from bot.channels.telegram.settings import TelegramBotSettings
from bot.errors import CONFIG, DoctorFailure, ErrorClass

_TELEGRAM_HINTS = {
    ErrorClass.AUTH: "the token is wrong or revoked: copy it again from @BotFather",
    ErrorClass.NETWORK: "api.telegram.org is unreachable from here: DNS, firewall or proxy",
    ErrorClass.TIMEOUT: "api.telegram.org did not answer in time: firewall or proxy",
}


def webhook_url(public_url: str, bot_name: str) -> str:
    """The bot's webhook address under the service's public base URL."""
    path = f"/telegram/{bot_name}"
    base = public_url.rstrip("/")
    return base if base.endswith(path) else base + path


async def check(
    http: aiohttp.ClientSession, bot: TelegramBotSettings, public_url: str | None
) -> str:
    api = TelegramApi.from_settings(http, bot)
    try:
        me: Any = await api.call("getMe")
        info: Any = await api.call("getWebhookInfo")
    except TelegramApiError as exc:
        # The error text never holds the token (the client keeps it out).
        raise DoctorFailure(
            exc.error_class.value, str(exc), _TELEGRAM_HINTS.get(exc.error_class)
        ) from None
    username = me.get("username", "?") if isinstance(me, dict) else "?"
    url = str(info.get("url", "")) if isinstance(info, dict) else ""
    set_webhook = f"run `botctl telegram set-webhook {bot.name} --url https://<public host>`"
    if not url:
        raise DoctorFailure(CONFIG, f"@{username}: no webhook is set", set_webhook)
    expected = webhook_url(public_url, bot.name) if public_url else None
    path = f"/telegram/{bot.name}"
    if (expected is not None and url != expected) or (expected is None and not url.endswith(path)):
        raise DoctorFailure(
            CONFIG,
            f"@{username}: webhook points at {url}, not at {expected or '...' + path}",
            set_webhook,
        )
    detail = f"@{username}, webhook {url}"
    pending = info.get("pending_update_count") if isinstance(info, dict) else None
    if pending:
        detail += f", {pending} update(s) waiting"
    last_error = info.get("last_error_message") if isinstance(info, dict) else None
    if last_error:
        detail += f", Telegram's last delivery error: {last_error}"
    return detail
