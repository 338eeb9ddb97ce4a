"""``ReplySink`` for Slack: the turn's text in, paced Web API calls out.

The paced pump (``bot.channels.pump``) pushes the newest text at each call
slot of the current delivery. Failures are kept and raised from the next
``delta`` / ``finish`` as ``DeliveryError``:

- 429: the pump waits out ``Retry-After`` (all replies of the workspace do) and
  pushes again;
- network, timeout, Slack 5xx: pushed again after a backoff with jitter;
- both within the reply's budget: the time it loses to failures stays within
  ``max_retry_wait_s`` (``bot.channels.delivery_retry``, one policy for every
  platform);
- anything else (auth, channel_not_found, ...): give up at once.

``auto`` mode starts with streams and falls back to chat.postMessage +
chat.update when the workspace lacks them (remembered for the workspace), or
when Slack ends a stream early (the same message is edited from then on).

A turn taken over from a dead worker (``delivery``, the dead sink's
``delivery_state``) goes on in the message that worker was writing, in the
way it was writing it: nothing already shown is posted again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from bot.channels.delivery_retry import DeliveryRetry
from bot.channels.pump import PacedReplySink
from bot.channels.slack.api import SlackCallError
from bot.channels.slack.deliveries import (
    Delivery,
    StoppedByUser,
    StreamDelivery,
    StreamExpired,
    StreamingUnsupported,
    UpdateDelivery,
    resumed,
)
from bot.channels.slack.outbound import Outbound, ReplyTarget
from bot.errors import DeliveryError, ErrorClass

log = structlog.get_logger(__name__)

# A half-decoded character at the end of the text so far: wait for the rest of it.
_INCOMPLETE = "\ufffd"


class SlackReplySink(PacedReplySink):
    def __init__(
        self,
        out: Outbound,
        target: ReplyTarget,
        *,
        turn_id: str,
        delivery: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            log=log.bind(turn_id=turn_id, slack_channel=target.channel_id),
            task_name=f"slack-reply-{turn_id}",
        )
        self._out = out
        self._target = target
        self._delivery: Delivery
        if delivery:
            self._delivery = resumed(out, target, delivery)
        elif out.streams(target.team_id):
            self._delivery = StreamDelivery(out, target)
        else:
            self._delivery = UpdateDelivery(out, target)
        self._fatal = False
        self._retry = DeliveryRetry(out.settings.max_retry_wait_s)

    def delivery_state(self) -> dict[str, Any] | None:
        """Where the reply's messages stand (``bot.turns.replies.ResumableSink``)."""
        return self._delivery.state()

    def _next_delay(self) -> float:
        return self._delivery.next_delay()

    async def _push(self, text: str, *, final: bool) -> bool:
        try:
            await self._delivery.push(text if final else text.rstrip(_INCOMPLETE), final=final)
        except StreamingUnsupported as exc:
            self._log.info("slack_streaming_unsupported", error=str(exc))
            self._out.streaming_unsupported(self._target.team_id)
            self._delivery = UpdateDelivery(self._out, self._target)
            return True
        except StreamExpired as exc:
            self._log.info("slack_stream_expired")
            self._delivery = exc.fallback
            return True
        except StoppedByUser:
            # The user ended the message; a "Stopped." apology would only be noise.
            self._fatal = True
            raise DeliveryError(ErrorClass.CANCELLED, "stopped_by_user") from None
        except SlackCallError as exc:
            return await self._after_call_error(exc)
        self._retry.succeeded()
        return False

    async def _after_call_error(self, exc: SlackCallError) -> bool:
        """True to push again: the policy found the failure passing and the wait in budget."""
        wait = self._retry.next_wait(exc.failure)
        if wait is None:
            self._fatal = exc.fatal
            raise DeliveryError(exc.error_class, f"{exc}{self._retry.given_up()}")
        self._log.info(
            "slack_call_retry",
            method=exc.method,
            error=exc.error,
            retry_after=exc.retry_after,
            wait_s=round(wait, 3),
            # A chat.postMessage or chat.appendStream whose answer was lost may repeat.
            may_duplicate=exc.failure.may_have_landed,
        )
        if exc.retry_after is None:
            await asyncio.sleep(wait)
        # After a 429 the pacer holds the method for Retry-After: the next push waits there.
        return True

    async def _apologise(self, error_class: ErrorClass, user_message: str) -> None:
        """Where Slack still takes it, post a short apology."""
        if self._fatal or error_class is ErrorClass.AUTH:
            self._log.info("slack_apology_skipped", error_class=error_class.value)
            return
        while True:
            try:
                await self._delivery.apologise(user_message)
                return
            except SlackCallError as exc:
                wait = self._retry.next_wait(exc.failure)
                if wait is None:
                    self._log.warning("slack_apology_failed", error=exc.error)
                    return
                if exc.retry_after is None:
                    await asyncio.sleep(wait)

    def describe(self) -> dict[str, Any]:
        """For the turn's log line."""
        mode = "stream" if isinstance(self._delivery, StreamDelivery) else "update"
        return {"mode": mode, "retry_lost_s": round(self._retry.lost_s, 3)}
