"""Per-chat pacing of one bot's calls, and the flood waits Telegram asks for.

Telegram counts per chat (about one message a second, 20 a minute in a
group) and per bot (about 30 a second). A 429 names how long to wait; that
wait holds for the chat it came from, so one flooded chat never stalls the
others. Waiting is ``wait``; taking the slot is ``reserve``, synchronous, so
two tasks of one chat can never both pass between a check and a call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

_PRUNE_ABOVE = 10_000
"""Past this many chats, forget those whose interval has run out (they need no entry)."""


@dataclass(frozen=True)
class PacingPolicy:
    private_min_interval_s: float
    group_min_interval_s: float
    global_max_calls_per_s: float


def is_private_chat(chat_id: int) -> bool:
    """Bot API chat ids: users (private chats) are positive, groups and channels negative."""
    return chat_id > 0


class ChatPacer:
    """Tracks, per chat, the earliest moment the next call may go out."""

    def __init__(self, policy: PacingPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._next_call: dict[int, float] = {}
        self._flood_until: dict[int | None, float] = {}
        self._next_global = 0.0

    def _interval(self, chat_id: int) -> float:
        if is_private_chat(chat_id):
            return self._policy.private_min_interval_s
        return self._policy.group_min_interval_s

    def delay(self, chat_id: int | None, *, paced: bool = True) -> float:
        """Seconds until a call to ``chat_id`` may go out (0 when it may go now)."""
        now = self._clock()
        ready = max(self._flood_until.get(None, 0.0), self._next_global)
        if chat_id is not None:
            ready = max(ready, self._flood_until.get(chat_id, 0.0))
            if paced:
                ready = max(ready, self._next_call.get(chat_id, 0.0))
        return max(0.0, ready - now)

    async def wait(self, chat_id: int | None, *, paced: bool = True) -> None:
        # Re-check after every sleep: a 429 may have pushed the moment further.
        # A deadline, not an event, is what is awaited here, hence the sleep loop.
        while (delay := self.delay(chat_id, paced=paced)) > 0:  # noqa: ASYNC110
            await asyncio.sleep(delay)

    def reserve(self, chat_id: int | None, *, paced: bool = True) -> None:
        """Record that a call goes out now."""
        now = self._clock()
        self._next_global = max(self._next_global, now) + 1.0 / self._policy.global_max_calls_per_s
        if chat_id is not None and paced:
            self._next_call[chat_id] = now + self._interval(chat_id)
            if len(self._next_call) > _PRUNE_ABOVE:
                self._next_call = {k: v for k, v in self._next_call.items() if v > now}

    def flood(self, chat_id: int | None, retry_after_s: float) -> None:
        """Telegram said 429: nothing more to this chat (or, without one, the bot) until then."""
        until = self._clock() + retry_after_s
        self._flood_until[chat_id] = max(self._flood_until.get(chat_id, 0.0), until)

    def flooded_for(self, chat_id: int | None) -> float:
        """Seconds of flood wait left for this chat."""
        return max(0.0, self._flood_until.get(chat_id, 0.0) - self._clock())
