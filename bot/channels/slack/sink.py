"""``ReplySink`` for Slack: the turn's text in, paced Web API calls out.

The paced pump (``bot.channels.pump``) pushes the newest text at each call
slot of the current delivery. Failures are kept and raised from the next
``delta`` / ``finish`` as ``DeliveryError``:

- 429: the pump waits out ``Retry-After`` (all replies of the workspace do) and
  pushes again, giving up once the waits add up to ``max_retry_wait_s``;
- network, timeout, Slack 5xx: a few retries with backoff;
- anything else (auth, channel_not_found, ...): give up at once.

``auto`` mode starts with streams and falls back to chat.postMessage +
chat.update when the workspace lacks them (remembered for the workspace), or
when Slack ends a stream early (the same message is edited from then on).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from bot.channels.pump import PacedReplySink
from bot.channels.slack.api import SlackCallError
from bot.channels.slack.deliveries import (
    Delivery,
    StoppedByUser,
    StreamDelivery,
    StreamExpired,
    StreamingUnsupported,
    UpdateDelivery,
)
from bot.channels.slack.outbound import Outbound, ReplyTarget
from bot.errors import DeliveryError, ErrorClass

log = structlog.get_logger(__name__)

MAX_TRANSIENT_RETRIES = 3
TRANSIENT_BACKOFF_S = 0.5
# A half-decoded character at the end of the text so far: wait for the rest of it.
_INCOMPLETE = "\ufffd"


class SlackReplySink(PacedReplySink):
    def __init__(self, out: Outbound, target: ReplyTarget, *, turn_id: str) -> None:
        super().__init__(
            log=log.bind(turn_id=turn_id, slack_channel=target.channel_id),
            task_name=f"slack-reply-{turn_id}",
        )
        self._out = out
        self._target = target
        self._delivery: Delivery = (
            StreamDelivery(out, target)
            if out.streams(target.team_id)
            else UpdateDelivery(out, target)
        )
        self._fatal = False
        self._transient = 0
        self._rate_waited_s = 0.0

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
        self._transient = 0
        return False

    async def _after_call_error(self, exc: SlackCallError) -> bool:
        """True to push again: a 429 within budget, or a transient error within its retries."""
        if exc.retry_after is not None:
            self._rate_waited_s += exc.retry_after
            if self._rate_waited_s > self._out.settings.max_retry_wait_s:
                raise DeliveryError(
                    ErrorClass.RATE_LIMITED, f"{exc}; waited {self._rate_waited_s:.0f} s"
                )
            self._log.info("slack_rate_limited", method=exc.method, retry_after=exc.retry_after)
            return True
        if exc.transient and self._transient < MAX_TRANSIENT_RETRIES:
            self._transient += 1
            await asyncio.sleep(TRANSIENT_BACKOFF_S * 2 ** (self._transient - 1))
            return True
        self._fatal = exc.fatal
        raise DeliveryError(exc.error_class, str(exc))

    async def _apologise(self, error_class: ErrorClass, user_message: str) -> None:
        """Where Slack still takes it, post a short apology."""
        if self._fatal or error_class is ErrorClass.AUTH:
            self._log.info("slack_apology_skipped", error_class=error_class.value)
            return
        for _attempt in range(2):
            try:
                await self._delivery.apologise(user_message)
                return
            except SlackCallError as exc:
                retry = exc.retry_after
                if retry is None or retry > self._out.settings.max_retry_wait_s:
                    self._log.warning("slack_apology_failed", error=exc.error)
                    return
                await asyncio.sleep(retry)
        self._log.warning("slack_apology_failed", error="ratelimited")

    def describe(self) -> dict[str, Any]:
        """For the turn's log line."""
        mode = "stream" if isinstance(self._delivery, StreamDelivery) else "update"
        return {"mode": mode, "rate_waited_s": round(self._rate_waited_s, 3)}
