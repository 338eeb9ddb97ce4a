"""``ReplySink`` for Slack: the turn's text in, paced Web API calls out.

``delta`` only records the latest text and wakes a pump task; the pump waits
for the next call slot, then pushes whatever the text is by then, so
intermediate states are dropped, never queued. Failures are kept and raised
from the next ``delta`` / ``finish`` as ``DeliveryError``:

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
import contextlib
from typing import Any

import structlog

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


class SlackReplySink:
    def __init__(self, out: Outbound, target: ReplyTarget, *, turn_id: str) -> None:
        self._out = out
        self._target = target
        self._log = log.bind(turn_id=turn_id, slack_channel=target.channel_id)
        self._delivery: Delivery = (
            StreamDelivery(out, target)
            if out.streams(target.team_id)
            else UpdateDelivery(out, target)
        )
        self._latest = ""
        self._final = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: DeliveryError | None = None
        self._fatal = False
        self._rate_waited_s = 0.0
        self.calls_failed = 0

    @property
    def mode(self) -> str:
        return "stream" if isinstance(self._delivery, StreamDelivery) else "update"

    def _ensure_pump(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name="slack-reply-pump")
        return self._task

    async def start(self) -> None:
        self._ensure_pump()

    async def delta(self, text_so_far: str) -> None:
        if self._error is not None:
            raise self._error
        self._latest = text_so_far
        self._wake.set()
        self._ensure_pump()

    async def finish(self, text: str) -> None:
        if self._error is not None:
            raise self._error
        self._latest = text
        self._final = True
        self._wake.set()
        task = self._ensure_pump()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if self._error is not None:
            raise self._error

    async def fail(self, error_class: ErrorClass, user_message: str) -> None:
        """Stop delivering and, where Slack still takes it, post a short apology."""
        await self._stop_pump()
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

    async def _stop_pump(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _give_up(self, error_class: ErrorClass, message: str, *, fatal: bool = False) -> None:
        self._error = DeliveryError(error_class, message)
        self._fatal = fatal
        self._log.warning("slack_delivery_failed", error_class=error_class.value, error=message)

    async def _pump(self) -> None:
        transient = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            delay = self._delivery.next_delay()
            if delay > 0:
                await asyncio.sleep(delay)
            final = self._final
            text = self._latest if final else self._latest.rstrip(_INCOMPLETE)
            try:
                await self._delivery.push(text, final=final)
            except StreamingUnsupported as exc:
                self._log.info("slack_streaming_unsupported", error=str(exc))
                self._out.streaming_unsupported(self._target.team_id)
                self._delivery = UpdateDelivery(self._out, self._target)
                self._wake.set()
                continue
            except StreamExpired as exc:
                self._log.info("slack_stream_expired")
                self._delivery = exc.fallback
                self._wake.set()
                continue
            except StoppedByUser:
                # The user ended the message; a "Stopped." apology would only be noise.
                self._give_up(ErrorClass.CANCELLED, "stopped_by_user", fatal=True)
                return
            except SlackCallError as exc:
                self.calls_failed += 1
                if exc.retry_after is not None:
                    self._rate_waited_s += exc.retry_after
                    if self._rate_waited_s > self._out.settings.max_retry_wait_s:
                        self._give_up(
                            ErrorClass.RATE_LIMITED, f"{exc}; waited {self._rate_waited_s:.0f} s"
                        )
                        return
                    self._log.info(
                        "slack_rate_limited", method=exc.method, retry_after=exc.retry_after
                    )
                    self._wake.set()
                    continue
                if exc.transient and transient < MAX_TRANSIENT_RETRIES:
                    transient += 1
                    await asyncio.sleep(TRANSIENT_BACKOFF_S * 2 ** (transient - 1))
                    self._wake.set()
                    continue
                self._give_up(exc.error_class, str(exc), fatal=exc.fatal)
                return
            except Exception:
                self._log.exception("slack_delivery_bug")
                self._give_up(ErrorClass.INTERNAL, "unexpected error in the Slack sink")
                return
            transient = 0
            if final:
                return

    def describe(self) -> dict[str, Any]:
        """For the turn's log line."""
        return {"mode": self.mode, "rate_waited_s": round(self._rate_waited_s, 3)}
