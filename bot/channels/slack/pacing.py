"""Spacing Web API calls, shared by every reply of one Slack app.

Slack limits each method per workspace (tiers) and chat.postMessage per
channel as well; a 429 names in ``Retry-After`` how long to keep off. One
``Pacer`` per app keeps, for each key, the earliest time the next call may go,
so concurrent replies in one workspace queue behind each other instead of
each finding the limit on its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable


class Pacer:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next_free: dict[Hashable, float] = {}
        self._blocked_until: dict[Hashable, float] = {}
        self._buckets: dict[Hashable, tuple[float, float]] = {}

    def delay(self, key: Hashable) -> float:
        """Seconds until a call under ``key`` may go, without reserving a slot."""
        now = self._clock()
        ready = max(self._next_free.get(key, now), self._blocked_until.get(key, now))
        return max(0.0, ready - now)

    async def wait(self, key: Hashable, interval: float) -> None:
        """Wait for this key's turn and hold the following ``interval`` seconds for it."""
        self._forget_old()
        while True:
            now = self._clock()
            blocked = self._blocked_until.get(key, 0.0)
            if blocked > now:
                await asyncio.sleep(blocked - now)
                continue
            start = max(now, self._next_free.get(key, 0.0))
            # Reserve before sleeping so callers arriving meanwhile queue behind us.
            self._next_free[key] = start + interval
            if start > now:
                await asyncio.sleep(start - now)
            if self._blocked_until.get(key, 0.0) <= self._clock():
                return

    async def take(self, key: Hashable, per_minute: float, burst: float) -> None:
        """Token bucket for a method's workspace-wide tier: bursts allowed, the rate kept."""
        while True:
            now = self._clock()
            tokens, last = self._buckets.get(key, (burst, now))
            tokens = min(burst, tokens + (now - last) * per_minute / 60.0)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return
            self._buckets[key] = (tokens, now)
            await asyncio.sleep((1.0 - tokens) * 60.0 / per_minute)

    def block(self, key: Hashable, seconds: float) -> None:
        """Slack said 429: nothing under ``key`` goes for ``seconds``."""
        until = self._clock() + seconds
        self._blocked_until[key] = max(self._blocked_until.get(key, 0.0), until)
        self._forget_old()

    def _forget_old(self) -> None:
        # Keys are per channel and message: drop the ones long past so the maps stay small.
        now = self._clock()
        if len(self._next_free) > 10_000:
            self._next_free = {k: v for k, v in self._next_free.items() if v > now}
        if len(self._blocked_until) > 10_000:
            self._blocked_until = {k: v for k, v in self._blocked_until.items() if v > now}
