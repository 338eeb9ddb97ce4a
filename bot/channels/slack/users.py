"""Display names for channel turns, from users.info, cached.

The name is looked up while Slack waits for its 3 s acknowledgement, so a
lookup has a short deadline and any failure falls back to the user id: a
missing name must never cost the message.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

import structlog

from bot.channels.slack.api import SlackApi, SlackCallError
from bot.channels.slack.settings import DEFAULT_USER_CACHE_SIZE

log = structlog.get_logger(__name__)


class UserNames:
    def __init__(
        self,
        api: SlackApi,
        *,
        ttl_s: float,
        timeout_s: float,
        max_entries: int = DEFAULT_USER_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._max_entries = max_entries
        self._clock = clock
        self._cache: OrderedDict[tuple[str, str], tuple[float, str]] = OrderedDict()

    async def name(self, team_id: str, user_id: str) -> str:
        key = (team_id, user_id)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self._clock():
            self._cache.move_to_end(key)
            return hit[1]
        try:
            async with asyncio.timeout(self._timeout_s):
                data = await self._api.users_info(user_id)
        except (SlackCallError, TimeoutError) as exc:
            log.info("slack_user_name_fallback", user_id=user_id, error=type(exc).__name__)
            return hit[1] if hit is not None else user_id
        name = _display_name(data) or user_id
        self._cache[key] = (self._clock() + self._ttl_s, name)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)
        return name


def _display_name(data: dict[str, object]) -> str | None:
    user = data.get("user")
    if not isinstance(user, dict):
        return None
    profile = user.get("profile") if isinstance(user.get("profile"), dict) else {}
    assert isinstance(profile, dict)
    for value in (
        profile.get("display_name"),
        profile.get("real_name"),
        user.get("real_name"),
        user.get("name"),
    ):
        if isinstance(value, str) and value.strip():
            # The name goes into the prompt as "name: text"; keep it one short line.
            return " ".join(value.split())[:80]
    return None
