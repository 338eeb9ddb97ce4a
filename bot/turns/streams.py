"""In-memory fan-out of a running turn's reply to any number of readers (SSE).

A reader can join at any time and from any position: positions are character
offsets into the reply, so ``Last-Event-ID: 120`` resumes after the 120th
character, whether the reply is still streaming or long finished. Finished
streams are kept for a short while for readers that are just connecting;
after that, readers fall back to the turn's stored row.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

FINISHED_RETENTION_S = 120.0


@dataclass(frozen=True)
class StreamEvent:
    kind: str  # "delta", "done" or "error"
    event_id: str
    data: dict[str, Any]


@dataclass
class _Stream:
    owner: str | None = None
    """Whose conversation the turn is in, when the process that accepted it opened it."""
    text: str = ""
    final: StreamEvent | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


def events_for_final(text: str, final: StreamEvent, offset: int) -> list[StreamEvent]:
    """What a reader at ``offset`` still needs once the reply is complete."""
    events = []
    if offset < len(text):
        events.append(StreamEvent("delta", str(len(text)), {"text": text[offset:]}))
    events.append(final)
    return events


class TurnStreams:
    def __init__(self, retention_s: float = FINISHED_RETENTION_S) -> None:
        self._streams: dict[str, _Stream] = {}
        self._retention_s = retention_s

    def open(self, turn_id: str, *, owner: str | None = None) -> None:
        stream = self._streams.setdefault(turn_id, _Stream())
        if owner is not None:
            stream.owner = owner

    def owner_of(self, turn_id: str) -> str | None:
        """The owner given to ``open``, while the stream is kept; None when not known here.

        A turn's owner never changes: a reader's stream can be checked against it
        without reading the database on the way to the turn's first token.
        """
        stream = self._streams.get(turn_id)
        return None if stream is None else stream.owner

    def has(self, turn_id: str) -> bool:
        return turn_id in self._streams

    async def append(self, turn_id: str, delta: str) -> None:
        stream = self._streams.get(turn_id)
        if stream is None or not delta:
            return
        async with stream.changed:
            stream.text += delta
            stream.changed.notify_all()

    async def close(self, turn_id: str, kind: str, data: dict[str, Any]) -> None:
        """Publish the final ``done`` or ``error`` event; readers then end."""
        stream = self._streams.setdefault(turn_id, _Stream())
        async with stream.changed:
            stream.final = StreamEvent(kind, kind, data)
            stream.changed.notify_all()
        asyncio.get_running_loop().call_later(self._retention_s, self._streams.pop, turn_id, None)

    async def subscribe(self, turn_id: str, offset: int = 0) -> AsyncIterator[StreamEvent]:
        stream = self._streams[turn_id]
        while True:
            async with stream.changed:
                start = offset
                await stream.changed.wait_for(
                    lambda: stream.final is not None or len(stream.text) > start  # noqa: B023
                )
                text, final = stream.text, stream.final
            if final is not None:
                for event in events_for_final(text, final, offset):
                    yield event
                return
            yield StreamEvent("delta", str(len(text)), {"text": text[offset:]})
            offset = len(text)
