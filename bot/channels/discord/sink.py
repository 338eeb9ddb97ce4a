"""``ReplySink`` for Discord: the turn's text in, paced edits out.

The paced pump (``bot.channels.pump``) pushes the newest text whenever the
delivery's next call may go (``DiscordApi.delay``: about one edit a second,
later while a bucket is empty or a 429's wait runs). Failures:

- 429: the pump waits out ``retry_after`` (every reply in the same bucket does:
  the shared ``Pacer``) and pushes again, giving up once the waits add up to
  ``max_retry_wait_s``;
- network, timeout, Discord's 5xx: a few retries with backoff;
- an interaction's token past its 15 minutes, 401, 403, 404: give up at once.
"""

from __future__ import annotations

import asyncio

import structlog

from bot.channels.discord.api import DiscordCallError
from bot.channels.discord.deliveries import Delivery, TokenExpired
from bot.channels.pump import PacedReplySink
from bot.errors import DeliveryError, ErrorClass

log = structlog.get_logger(__name__)

MAX_TRANSIENT_RETRIES = 3
TRANSIENT_BACKOFF_S = 0.5
# A half-decoded character at the end of the text so far: wait for the rest of it.
_INCOMPLETE = "\ufffd"


class DiscordReplySink(PacedReplySink):
    def __init__(self, delivery: Delivery, *, max_retry_wait_s: float, turn_id: str) -> None:
        super().__init__(log=log.bind(turn_id=turn_id), task_name=f"discord-reply-{turn_id}")
        self._delivery = delivery
        self._max_retry_wait_s = max_retry_wait_s
        self._fatal = False
        self._transient = 0
        self._rate_waited_s = 0.0

    def _next_delay(self) -> float:
        return self._delivery.next_delay()

    async def _push(self, text: str, *, final: bool) -> bool:
        try:
            await self._delivery.push(text if final else text.rstrip(_INCOMPLETE), final=final)
        except TokenExpired:
            self._fatal = True
            raise DeliveryError(ErrorClass.DELIVERY, "interaction token expired") from None
        except DiscordCallError as exc:
            return await self._after_call_error(exc)
        self._transient = 0
        return False

    async def _after_call_error(self, exc: DiscordCallError) -> bool:
        """True to push again: a 429 within budget, or a transient error within its retries."""
        if exc.retry_after is not None:
            self._rate_waited_s += exc.retry_after
            if self._rate_waited_s > self._max_retry_wait_s:
                raise DeliveryError(
                    ErrorClass.RATE_LIMITED, f"{exc}; waited {self._rate_waited_s:.0f} s"
                )
            self._log.info("discord_rate_limited", route=exc.route, retry_after=exc.retry_after)
            if exc.status != 429:  # not a bucket the pacer blocks: wait here
                await asyncio.sleep(exc.retry_after)
            return True
        if exc.transient and self._transient < MAX_TRANSIENT_RETRIES:
            self._transient += 1
            await asyncio.sleep(TRANSIENT_BACKOFF_S * 2 ** (self._transient - 1))
            return True
        self._fatal = exc.fatal
        raise DeliveryError(exc.error_class, str(exc))

    async def _apologise(self, error_class: ErrorClass, user_message: str) -> None:
        """Where Discord still takes it, say the reply failed."""
        if self._fatal or error_class is ErrorClass.AUTH:
            self._log.info("discord_apology_skipped", error_class=error_class.value)
            return
        for _attempt in range(2):
            try:
                await self._delivery.apologise(user_message)
                return
            except TokenExpired:
                break
            except DiscordCallError as exc:
                retry = exc.retry_after
                if retry is None or retry > self._max_retry_wait_s:
                    self._log.warning("discord_apology_failed", error=str(exc))
                    return
                await asyncio.sleep(retry)
        self._log.warning("discord_apology_failed", error="rate limited or token expired")
