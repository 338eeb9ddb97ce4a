"""Doctor check of a Discord application: its bot token, its public key, its endpoint URL.

``GET /users/@me`` with the bot token proves the token; ``GET
/applications/@me`` says which application the token belongs to, its public
key (``verify_key``: the one that must verify the interactions) and the
Interactions Endpoint URL saved in the Developer Portal.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from bot.channels.discord.api import Call, DiscordApi, DiscordCallError
from bot.channels.discord.settings import DiscordBotSettings
from bot.errors import CONFIG, DoctorFailure, ErrorClass

_HINTS = {
    ErrorClass.AUTH: "the token is wrong or was reset: copy it again (Developer Portal → Bot)",
    ErrorClass.NETWORK: "discord.com is unreachable from here: DNS, firewall or proxy",
    ErrorClass.TIMEOUT: "discord.com did not answer in time: firewall or proxy",
}
_PORTAL = "Developer Portal → General Information"


def endpoint_url(public_url: str, bot_name: str) -> str:
    """The bot's Interactions Endpoint URL under the service's public base URL."""
    path = f"/discord/{bot_name}"
    base = public_url.rstrip("/")
    return base if base.endswith(path) else base + path


async def _get(api: DiscordApi, route: str) -> dict[str, Any]:
    document = await api.send(Call("GET", route, route, "doctor"))
    if not isinstance(document, dict):
        raise DiscordCallError(route, status=200, error="not a JSON object")
    return document


async def check(
    http: aiohttp.ClientSession, bot: DiscordBotSettings, public_url: str | None
) -> str:
    api = DiscordApi(http, bot)
    try:
        me = await _get(api, "/users/@me")
        application = await _get(api, "/applications/@me")
    except DiscordCallError as exc:
        raise DoctorFailure(exc.error_class.value, str(exc), _HINTS.get(exc.error_class)) from None
    name = f"{me.get('username', '?')} ({me.get('id', '?')})"
    if application.get("id") != bot.application_id:
        raise DoctorFailure(
            CONFIG,
            f"{name}: the token belongs to application {application.get('id')}, "
            f"not {bot.application_id}",
            f"application_id and token must come from the same application ({_PORTAL})",
        )
    if str(application.get("verify_key", "")).lower() != bot.public_key:
        raise DoctorFailure(
            CONFIG,
            f"{name}: public_key is not the application's public key",
            f"copy Public Key from {_PORTAL}: every interaction would get 401",
        )
    url = application.get("interactions_endpoint_url") or ""
    expected = endpoint_url(public_url, bot.name) if public_url else None
    path = f"/discord/{bot.name}"
    if not url or (expected and url != expected) or (not expected and not url.endswith(path)):
        raise DoctorFailure(
            CONFIG,
            f"{name}: the Interactions Endpoint URL is {url or 'not set'}, "
            f"not {expected or '...' + path}",
            f"set it in {_PORTAL} (docs/discord.md)",
        )
    gateway = ", gateway on" if bot.gateway else ""
    return f"{name}, public key matches, endpoint {url}{gateway}"
