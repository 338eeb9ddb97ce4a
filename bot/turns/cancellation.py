"""Stop requests for the turns this process runs, carried out on their generation only.

Only a turn's generation (the engine stream and the delivery of its deltas)
is ever cancelled. Its start (queued -> running) and its final write run to
their end whenever a stop arrives, so a turn is never left half-written: it
is either stopped before generating (and fails as ``cancelled`` at once),
stopped while generating (``cancelled``, with what was said so far), or done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any


def stop_requested() -> bool:
    """True once the current task has been cancelled, whatever exception is on its way out.

    A background loop that retries after ``except Exception`` must end instead when this
    is true: a library may turn the ``CancelledError`` into another exception on the way
    out (SQLAlchemy invalidating a SQLite connection interrupted mid-statement did), and a
    loop that kept polling would make whoever cancelled it wait for ever.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Cancellations:
    def __init__(self) -> None:
        self._requested: set[str] = set()
        self._generating: dict[str, asyncio.Task[Any]] = {}

    def request(self, turn_id: str) -> bool:
        """Stop ``turn_id`` now, or as soon as it starts generating; False if already asked.

        Asking twice changes nothing: a second ``cancel()`` could interrupt the
        generation's own clean-up (aborting the engine request).
        """
        if turn_id in self._requested:
            return False
        self._requested.add(turn_id)
        task = self._generating.get(turn_id)
        if task is not None:
            task.cancel()
        return True

    @contextlib.contextmanager
    def generating(self, turn_id: str, task: asyncio.Task[Any]) -> Iterator[None]:
        """While the block runs, a stop request for ``turn_id`` cancels ``task``."""
        self._generating[turn_id] = task
        if turn_id in self._requested:
            task.cancel()
        try:
            yield
        finally:
            self._generating.pop(turn_id, None)

    def forget(self, turn_id: str) -> None:
        """The turn has ended here: drop its request, if any."""
        self._requested.discard(turn_id)
        self._generating.pop(turn_id, None)
