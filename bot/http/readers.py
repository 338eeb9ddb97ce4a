"""This worker's open event streams: counted, capped per API key, ended when their client leaves.

``botctl serve`` runs aiohttp's ``AppRunner``, whose ``handler_cancellation``
is off by default: a handler is *not* cancelled when its client disconnects
(aiohttp's test server turns it on, so tests under ``aiohttp_client`` never
see this). A reader waiting for a queued turn writes nothing, so no failed
write tells it either: it would wait, and poll, until the turn ends. Here one
watcher task per worker looks at the connection of every open stream each
``DISCONNECT_CHECK_S`` and sets the stream's ``gone`` event when it is closed;
the stream's pump (``bot.http.sse.pump_events``) then stops at once.

Turning ``handler_cancellation`` on for the whole app would do the same for
streams but would also cut ``POST`` handlers mid-transaction when a client
hangs up; the acknowledgement must not depend on the client staying.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from aiohttp import web

DISCONNECT_CHECK_S = 0.2
"""How often the watcher looks at the open streams' connections (one pass over all of them)."""


class StreamSlot:
    """One open stream of one API key; ``release`` gives the slot back (idempotent)."""

    def __init__(self, owner: EventStreamReaders, key_id: str, request: web.Request) -> None:
        self._owner = owner
        self.key_id = key_id
        self.request = request
        self.gone = asyncio.Event()
        """Set once the client's connection is closed."""
        self._released = False

    def connection_closed(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._owner.discard(self)


class EventStreamReaders:
    def __init__(self, max_per_key: int, check_s: float = DISCONNECT_CHECK_S) -> None:
        self.max_per_key = max_per_key
        self.check_s = check_s
        self._per_key: Counter[str] = Counter()
        self._slots: set[StreamSlot] = set()
        self._watcher: asyncio.Task[None] | None = None

    @property
    def count(self) -> int:
        """Streams open on this worker now."""
        return len(self._slots)

    def open_for(self, key_id: str) -> int:
        return self._per_key[key_id]

    def reserve(self, key_id: str, request: web.Request) -> StreamSlot | None:
        """A slot for a new stream of ``key_id``, or None when the key holds its maximum."""
        if self._per_key[key_id] >= self.max_per_key:
            return None
        slot = StreamSlot(self, key_id, request)
        self._per_key[key_id] += 1
        self._slots.add(slot)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch(), name="event-stream-watcher")
        return slot

    def discard(self, slot: StreamSlot) -> None:
        """Forget a slot (``StreamSlot.release`` calls this)."""
        self._slots.discard(slot)
        self._per_key[slot.key_id] -= 1
        if self._per_key[slot.key_id] <= 0:
            del self._per_key[slot.key_id]

    async def _watch(self) -> None:
        while self._slots:
            await asyncio.sleep(self.check_s)
            for slot in list(self._slots):
                if not slot.gone.is_set() and slot.connection_closed():
                    slot.gone.set()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
