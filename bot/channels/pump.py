"""One paced reply pump for every channel: the turn's text in, a platform's calls out.

``delta`` records the newest text and wakes one pump task, so the turn never
waits on the platform. The pump waits for the next call slot, then pushes
whatever the text is by then: intermediate states are dropped, never queued.

Stopping never cancels a platform call in flight: one cut off may already
have created a message or delivered a callback, and losing its id or its
sequence number shows the reply twice. ``fail`` lets the push in flight
complete, pushes nothing more, then apologises; a caller cancelled inside
``finish`` leaves the pump to complete the same way. Only the wait for a
call slot is cut short.

A platform supplies only its delivery: ``_push`` (True: call me again with
the newest text; ``DeliveryError``: give up, and the next ``delta`` or
``finish`` raises it), ``_next_delay`` before a preview push (the final push
goes at once, its calls wait for their own slot) and ``_apologise``.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod

from structlog.stdlib import BoundLogger

from bot.errors import DeliveryError, ErrorClass


class PacedReplySink(ABC):
    """A ``ReplySink`` whose platform calls go out from one paced pump task."""

    def __init__(self, *, log: BoundLogger, task_name: str) -> None:
        self._log = log
        self._task_name = task_name
        self.text_so_far = ""
        self._final = False
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.gave_up: DeliveryError | None = None
        """Why the pump stopped pushing, when the platform refused for good."""

    # -- the platform's delivery -------------------------------------------------------

    @abstractmethod
    async def _push(self, text: str, *, final: bool) -> bool:
        """Show ``text``; True to be called again. Raises ``DeliveryError`` to give up."""

    def _next_delay(self) -> float:
        """Seconds until the next preview push may go out."""
        return 0.0

    @abstractmethod
    async def _apologise(self, error_class: ErrorClass, user_message: str) -> None:
        """Tell the user the reply failed; called once the pump has stopped."""

    # -- ReplySink ---------------------------------------------------------------------

    async def start(self) -> None:
        return None

    async def delta(self, text_so_far: str) -> None:
        self._raise_if_gave_up()
        self.text_so_far = text_so_far
        self._wake_pump()

    async def finish(self, text: str) -> None:
        self._raise_if_gave_up()
        self.text_so_far = text
        self._final = True
        task = self._wake_pump()
        if task is not None:
            # ``wait``, not ``await task``: a cancelled caller must not cancel the pump.
            await asyncio.wait({task})
        self._raise_if_gave_up()

    async def fail(self, error_class: ErrorClass, user_message: str) -> None:
        self._stopping.set()
        self._wake.set()
        if self._task is not None:
            await asyncio.wait({self._task})
        await self._apologise(error_class, user_message)

    # -- the pump ----------------------------------------------------------------------

    def _raise_if_gave_up(self) -> None:
        if self.gave_up is not None:
            raise self.gave_up

    def _wake_pump(self) -> asyncio.Task[None] | None:
        if self._stopping.is_set():
            return None
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._task_name)
        return self._task

    async def _wait_for_slot(self) -> None:
        # Re-checked after each wait: another reply may have taken the slot meanwhile.
        while not self._stopping.is_set() and (delay := self._next_delay()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._final:
                await self._wait_for_slot()
            if self._stopping.is_set():
                return
            final = self._final
            try:
                again = await self._push(self.text_so_far, final=final)
            except Exception as exc:
                self._give_up(exc)
                return
            if again:
                self._wake.set()
            elif final:
                return

    def _give_up(self, exc: Exception) -> None:
        if not isinstance(exc, DeliveryError):
            self._log.exception("reply_delivery_bug", exc_info=exc)
            exc = DeliveryError(ErrorClass.INTERNAL, "unexpected error in the sink")
        self.gave_up = exc
        self._log.warning(
            "reply_delivery_failed", error_class=exc.error_class.value, error=exc.message
        )
