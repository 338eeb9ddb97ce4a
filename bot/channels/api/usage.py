"""``GET /v1/usage``: the key owner's turns and tokens, today and per day (``bot.turns.usage``).

``today`` is the calling key's own day, beside the daily token limit that
applies to it (fair use counts per key); ``days`` is the owner's, over all
their keys, per UTC day and channel (``api`` and ``openai``: the channels an
API key talks through, so a key owner never sees a chat platform's tenant that
happens to share the name). The web page shows ``today``.
"""

from __future__ import annotations

import datetime as dt

from aiohttp import web

from bot.apikeys import Principal
from bot.channels.api.kind import API
from bot.channels.openai.kind import OPENAI
from bot.http.errors import json_error
from bot.http.key_gate import Scope, requires
from bot.http.keys import USAGE
from bot.turns.limits import key_subject
from bot.turns.usage import UsageQuery

DEFAULT_DAYS = 7
MAX_DAYS = 90
KEY_CHANNELS = (API.name, OPENAI.name)


def _days(request: web.Request) -> int | None:
    text = request.query.get("days")
    if text is None:
        return DEFAULT_DAYS
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_DAYS:
        return None
    return int(text)


@requires(Scope.CHAT)
async def get_usage(request: web.Request, principal: Principal) -> web.Response:
    days = _days(request)
    if days is None:
        return json_error(400, "bad_request", f"days must be a whole number from 1 to {MAX_DAYS}")
    usage = request.app[USAGE]
    today = await usage.today(
        UsageQuery(owner=principal.owner, channels=KEY_CHANNELS, api_key_id=principal.key_id),
        subject=key_subject(principal.key_id),
    )
    start = dt.datetime.combine(today.day, dt.time(), dt.UTC) - dt.timedelta(days=days - 1)
    rows = await usage.rows(UsageQuery(owner=principal.owner, channels=KEY_CHANNELS, since=start))
    return web.json_response(
        {
            "owner": principal.owner,
            "today": today.as_dict(),
            "days": [
                {key: value for key, value in row.as_dict().items() if key != "owner"}
                for row in rows
            ],
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/usage", get_usage)
