"""``ReplySink`` for Discord: the turn's text in, paced edits out.

The paced pump (``bot.channels.pump``) pushes the newest text whenever the
delivery's next call may go (``DiscordApi.delay``: about one edit a second,
later while a bucket is empty or a 429's wait runs). Failures:

- 429: the pump waits out ``retry_after`` (every reply in the same bucket does:
  the shared ``Pacer``) and pushes again;
- network, timeout, Discord's 5xx: pushed again after a backoff with jitter;
- both within the reply's budget: the time it loses to failures stays within
  ``max_retry_wait_s`` (``bot.channels.delivery_retry``, one policy for every
  platform);
- an interaction's token past its 15 minutes, 401, 403, 404: give up at once.

A turn taken over from a dead worker goes on editing the message that worker
was writing (``Delivery.restore`` of its ``delivery_state``): nothing already
shown is posted again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from bot.channels.delivery_retry import DeliveryRetry
from bot.channels.discord.api import DiscordCallError
from bot.channels.discord.deliveries import Delivery, TokenExpired
from bot.channels.pump import PacedReplySink
from bot.errors import DeliveryError, ErrorClass

log = structlog.get_logger(__name__)

# A half-decoded character at the end of the text so far: wait for the rest of it.
_INCOMPLETE = "\ufffd"


class DiscordReplySink(PacedReplySink):
    def __init__(self, delivery: Delivery, *, max_retry_wait_s: float, turn_id: str) -> None:
        super().__init__(log=log.bind(turn_id=turn_id), task_name=f"discord-reply-{turn_id}")
        self._delivery = delivery
        self._fatal = False
        self._retry = DeliveryRetry(max_retry_wait_s)

    def delivery_state(self) -> dict[str, Any] | None:
        """Where the reply's messages stand (``bot.turns.replies.ResumableSink``)."""
        return self._delivery.state()

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
        self._retry.succeeded()
        return False

    async def _after_call_error(self, exc: DiscordCallError) -> bool:
        """True to push again: the policy found the failure passing and the wait in budget."""
        wait = self._retry.next_wait(exc.failure)
        if wait is None:
            self._fatal = exc.fatal
            raise DeliveryError(exc.error_class, f"{exc}{self._retry.given_up()}")
        self._log.info(
            "discord_call_retry",
            route=exc.route,
            status=exc.status,
            network=exc.network,
            retry_after=exc.retry_after,
            wait_s=round(wait, 3),
            # A follow-up message whose answer was lost may be posted twice.
            may_duplicate=exc.failure.may_have_landed,
        )
        if exc.status != 429:  # not a bucket the pacer blocks: wait here
            await asyncio.sleep(wait)
        return True

    async def _apologise(self, error_class: ErrorClass, user_message: str) -> None:
        """Where Discord still takes it, say the reply failed."""
        if self._fatal or error_class is ErrorClass.AUTH:
            self._log.info("discord_apology_skipped", error_class=error_class.value)
            return
        while True:
            try:
                await self._delivery.apologise(user_message)
                return
            except TokenExpired:
                self._log.warning("discord_apology_failed", error="interaction token expired")
                return
            except DiscordCallError as exc:
                wait = self._retry.next_wait(exc.failure)
                if wait is None:
                    self._log.warning("discord_apology_failed", error=str(exc))
                    return
                if exc.status != 429:
                    await asyncio.sleep(wait)
