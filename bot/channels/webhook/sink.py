"""``ReplySink`` for the generic webhook: ordered, signed chunk callbacks, then a final one.

``delta`` records the text so far and wakes a pump task. The pump sends one
callback at a time and only after the previous one was acknowledged, so the
receiver gets ``seq`` 0, 1, 2, ... in order; text that arrives meanwhile is
merged into the next chunk (never queued as many small ones). ``finish`` waits
for the remaining text and then the ``final`` message (full text and usage).
Once a callback gives up, the error is raised from the next ``delta`` /
``finish`` and the turn fails as ``delivery``.

Bodies (see docs/webhook.md)::

    {"type": "chunk", "seq": 0, "offset": 0, "text": "Hel", ...}
    {"type": "final", "seq": 3, "text": "Hello!", "usage": {...}, ...}
    {"type": "error", "seq": 2, "error_class": "cancelled", "message": "Stopped.", ...}
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from bot.channels.base import TurnAddress
from bot.channels.webhook.callbacks import CallbackClient
from bot.errors import DeliveryError, ErrorClass


class WebhookReplySink:
    def __init__(
        self,
        callbacks: CallbackClient,
        address: TurnAddress,
        *,
        webhook: str,
        chunk_interval_s: float,
    ) -> None:
        self._callbacks = callbacks
        self._envelope: dict[str, Any] = {
            "webhook": webhook,
            "turn_id": address.turn_id,
            "conversation_id": address.reply_to.get("conversation_id"),
            "in_reply_to": address.reply_to.get("message_id"),
        }
        self._turn_id = address.turn_id
        self._interval = chunk_interval_s
        self._latest = ""
        self._sent = 0
        self._seq = 0
        self._final = False
        self._usage: dict[str, int | None] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: DeliveryError | None = None

    # -- ReplySink -------------------------------------------------------------------

    async def start(self) -> None:
        return None

    async def delta(self, text_so_far: str) -> None:
        if self._error is not None:
            raise self._error
        self._latest = text_so_far
        self._wake.set()
        self._ensure_pump()

    def set_usage(self, usage: dict[str, int | None]) -> None:
        self._usage = dict(usage)

    async def finish(self, text: str) -> None:
        if self._error is not None:
            raise self._error
        self._latest = text
        self._final = True
        self._wake.set()
        await self._ensure_pump()
        if self._error is not None:
            raise self._error

    async def fail(self, error_class: ErrorClass, user_message: str) -> None:
        if self._task is not None and not self._task.done():
            # Stop streaming; a chunk cut off mid-POST may or may not have arrived,
            # which is why the error message carries the next seq after the last sent.
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._error is not None:
            # The receiver is the thing that failed: another round of retries would fail too.
            return
        await self._send(
            {"type": "error", "error_class": error_class.value, "message": user_message}
        )

    # -- the pump --------------------------------------------------------------------

    def _ensure_pump(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name=f"webhook-reply-{self._turn_id}")
        return self._task

    async def _pump(self) -> None:
        try:
            while True:
                if len(self._latest) > self._sent:
                    piece = self._latest[self._sent :]
                    await self._send({"type": "chunk", "offset": self._sent, "text": piece})
                    self._sent += len(piece)
                    if self._interval and not self._final:
                        await asyncio.sleep(self._interval)
                    continue
                if self._final:
                    await self._send({"type": "final", "text": self._latest, "usage": self._usage})
                    return
                # No await between the check above and clear(): a delta cannot slip in between.
                self._wake.clear()
                await self._wake.wait()
        except DeliveryError as exc:
            self._error = exc

    async def _send(self, body: dict[str, Any]) -> None:
        seq = self._seq
        self._seq += 1
        await self._callbacks.deliver(
            {**body, **self._envelope, "seq": seq}, delivery_id=f"{self._turn_id}.{seq}"
        )
