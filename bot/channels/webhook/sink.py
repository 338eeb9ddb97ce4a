"""``ReplySink`` for the generic webhook: ordered, signed chunk callbacks, then a final one.

The paced pump (``bot.channels.pump``) sends one callback at a time and only
after the previous one was acknowledged, so the receiver gets ``seq`` 0, 1,
2, ... in order; text that arrives meanwhile is merged into the next chunk
(never queued as many small ones), at most one chunk per
``chunk_interval_s``. ``finish`` sends the remaining text and then the
``final`` message (full text and usage). Once a callback gives up, the error
is raised from the next ``delta`` / ``finish`` and the turn fails as
``delivery``.

Bodies (see docs/webhook.md)::

    {"type": "chunk", "seq": 0, "offset": 0, "text": "Hel", ...}
    {"type": "final", "seq": 3, "text": "Hello!", "usage": {...}, ...}
    {"type": "error", "seq": 2, "error_class": "cancelled", "message": "Stopped.", ...}
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from bot.channels.base import TurnAddress
from bot.channels.pump import PacedReplySink
from bot.channels.webhook.callbacks import CallbackClient
from bot.errors import ErrorClass

log = structlog.get_logger(__name__)


class WebhookReplySink(PacedReplySink):
    def __init__(
        self,
        callbacks: CallbackClient,
        address: TurnAddress,
        *,
        webhook: str,
        chunk_interval_s: float,
    ) -> None:
        super().__init__(
            log=log.bind(turn_id=address.turn_id, webhook=webhook),
            task_name=f"webhook-reply-{address.turn_id}",
        )
        self._callbacks = callbacks
        self._envelope: dict[str, Any] = {
            "webhook": webhook,
            "turn_id": address.turn_id,
            "conversation_id": address.reply_to.get("conversation_id"),
            "in_reply_to": address.reply_to.get("message_id"),
        }
        self._turn_id = address.turn_id
        self._interval = chunk_interval_s
        self._sent = 0
        self._seq = 0
        self._next_chunk_at = 0.0
        self._usage: dict[str, int | None] = {}
        self._retry = callbacks.new_retry()
        if address.delivery:
            # Taken over from a dead worker: the receiver has the chunks up to here.
            self._sent = int(address.delivery.get("sent", 0))
            self._seq = int(address.delivery.get("seq", 0))

    def delivery_state(self) -> dict[str, Any] | None:
        """The offset and ``seq`` the next chunk gets (``bot.turns.replies.ResumableSink``)."""
        return {"sent": self._sent, "seq": self._seq}

    def set_usage(self, usage: dict[str, int | None]) -> None:
        self._usage = dict(usage)

    # -- the pump's delivery ---------------------------------------------------------

    def _next_delay(self) -> float:
        return self._next_chunk_at - time.monotonic()

    async def _push(self, text: str, *, final: bool) -> bool:
        if len(text) > self._sent:
            piece = text[self._sent :]
            await self._send({"type": "chunk", "offset": self._sent, "text": piece})
            self._sent += len(piece)
            self._next_chunk_at = time.monotonic() + self._interval
        if final:
            await self._send({"type": "final", "text": text, "usage": self._usage})
        return False

    async def _apologise(self, error_class: ErrorClass, user_message: str) -> None:
        if self.gave_up is not None:
            # The receiver is the thing that failed: another round of retries would fail too.
            return
        # After every chunk the receiver got: the pump never cuts a callback off mid-POST.
        await self._send(
            {"type": "error", "error_class": error_class.value, "message": user_message}
        )

    async def _send(self, body: dict[str, Any]) -> None:
        seq = self._seq
        self._seq += 1
        await self._callbacks.deliver(
            {**body, **self._envelope, "seq": seq},
            delivery_id=f"{self._turn_id}.{seq}",
            retry=self._retry,
        )
