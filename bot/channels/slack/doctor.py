"""Doctor check of a Slack app: its bot token (``auth.test``)."""

from __future__ import annotations

import aiohttp

from bot.channels.slack.api import SlackApi, SlackCallError, make_client
from bot.channels.slack.settings import SlackAppSettings
from bot.errors import DoctorFailure, ErrorClass

_SLACK_HINTS = {
    ErrorClass.AUTH: "bot_token is wrong, revoked, or the app was uninstalled from the workspace",
    ErrorClass.NETWORK: "slack.com is unreachable from here: DNS, firewall or proxy",
    ErrorClass.TIMEOUT: "slack.com did not answer in time: firewall or proxy",
}


async def check(http: aiohttp.ClientSession, app: SlackAppSettings, public_url: str | None) -> str:
    api = SlackApi(make_client(app, http), timeout_s=app.api_timeout_s)
    try:
        data = await api.auth_test()
    except SlackCallError as exc:
        raise DoctorFailure(
            exc.error_class.value, str(exc), _SLACK_HINTS.get(exc.error_class)
        ) from None
    # Slack offers no API to read an app's Events request URL: that part stays manual.
    return (
        f"team {data.get('team_id', '?')}, bot user {data.get('user_id', '?')} "
        "(Events request URL: check it in the app's settings)"
    )
