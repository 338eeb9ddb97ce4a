"""Readers of turns this worker is not streaming: one database poller per turn, however many read.

With several workers (PostgreSQL) a reader may follow a turn that is queued,
or running on another worker: its only source is the turn's row, where the
running worker saves the reply so far (``bot.turns.partials``). Polling that
row once per reader made the database's load grow with the number of open
streams, connected or not (500 readers of one queued turn: 2,000 queries a
second). Here every turn being followed has one poller, shared by all its
readers on this worker; it runs while at least one reader is left and stops
with the last one.

Why polling and not PostgreSQL ``LISTEN/NOTIFY``: the row is written by code
that knows nothing of readers (the runner, the partial saves, a takeover on
another worker), SQLite has no notifications, and a LISTEN needs a connection
held for ever per worker. One cheap primary-key read per followed turn per
interval is bounded by the number of distinct turns being read, which is
bounded by the streams each key may hold open (``server.max_streams_per_key``).

When the turn starts running on this worker (its in-memory stream opens), the
readers move over to ``TurnStreams`` and get token-by-token deltas from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.models import Turn, TurnStatus
from bot.turns.ending import end_of_row, final_event
from bot.turns.streams import StreamEvent, TurnStreams, events_for_final

log = structlog.get_logger(__name__)

STORED_TURN_POLL_S = 0.25
"""How often a followed turn's row is read (the partial reply is saved every 0.5 s)."""
FIRST_POLL_S = 0.02
"""The first re-read: with several workers a new turn usually starts on this worker a
moment after it was accepted, and its stream opens then; the interval doubles up to
``STORED_TURN_POLL_S``."""


@dataclass
class _Feed:
    """What the poller of one turn has seen so far, for all of its readers."""

    text: str = ""
    final: StreamEvent | None = None
    missing: bool = False
    local: bool = False
    """The turn now streams from this worker's memory: readers switch to ``TurnStreams``."""
    readers: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    task: asyncio.Task[None] | None = None

    @property
    def settled(self) -> bool:
        return self.final is not None or self.missing or self.local


class TurnFollowers:
    """Per-worker registry of shared pollers of turn rows."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        streams: TurnStreams,
        poll_s: float = STORED_TURN_POLL_S,
    ) -> None:
        self._sessions = sessions
        self._streams = streams
        self.poll_s = poll_s
        self._feeds: dict[str, _Feed] = {}

    @property
    def pollers(self) -> int:
        """Turns whose row is being polled now (one poller each)."""
        return sum(1 for feed in self._feeds.values() if feed.task and not feed.task.done())

    @property
    def readers(self) -> int:
        """Readers waiting on a poller now."""
        return sum(feed.readers for feed in self._feeds.values())

    async def follow(self, turn_id: str, offset: int = 0) -> AsyncGenerator[StreamEvent, None]:
        """The turn's events from ``offset`` on: from its row, or from memory once it runs here."""
        if self._streams.has(turn_id):
            async for event in self._streams.subscribe(turn_id, offset):
                yield event
            return
        feed = self._join(turn_id)
        try:
            while True:
                async with feed.changed:
                    start = offset
                    await feed.changed.wait_for(
                        lambda: feed.settled or len(feed.text) > start  # noqa: B023
                    )
                    text, final, missing, local = feed.text, feed.final, feed.missing, feed.local
                if final is not None:
                    for event in events_for_final(text, final, offset):
                        yield event
                    return
                if len(text) > offset:
                    yield StreamEvent("delta", str(len(text)), {"text": text[offset:]})
                    offset = len(text)
                if missing:
                    return
                if local:
                    break
        finally:
            self._leave(turn_id, feed)
        async for event in self._streams.subscribe(turn_id, offset):
            yield event

    async def close(self) -> None:
        """Stop every poller (application shutdown)."""
        tasks = [feed.task for feed in self._feeds.values() if feed.task is not None]
        self._feeds.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- internals ---------------------------------------------------------------------

    def _join(self, turn_id: str) -> _Feed:
        feed = self._feeds.get(turn_id)
        if feed is None or feed.settled:
            # A settled feed belongs to readers still draining it; a newcomer starts afresh.
            feed = _Feed()
            self._feeds[turn_id] = feed
            feed.task = asyncio.create_task(self._poll(turn_id, feed), name=f"follow-{turn_id}")
        feed.readers += 1
        return feed

    def _leave(self, turn_id: str, feed: _Feed) -> None:
        feed.readers -= 1
        if feed.readers > 0:
            return
        if self._feeds.get(turn_id) is feed:
            del self._feeds[turn_id]
        if feed.task is not None and not feed.task.done():
            # Nobody is reading: the row is not read again.
            feed.task.cancel()

    async def _poll(self, turn_id: str, feed: _Feed) -> None:
        pause = min(FIRST_POLL_S, self.poll_s)
        try:
            while not feed.settled:
                await self._poll_once(turn_id, feed)
                if not feed.settled:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, self.poll_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A database blink: readers end without a final event and may resume with
            # Last-Event-ID; the turn itself is not affected.
            log.warning("turn_follow_failed", turn_id=turn_id, error=f"{type(exc).__name__}: {exc}")
            async with feed.changed:
                feed.missing = True
                feed.changed.notify_all()

    async def _poll_once(self, turn_id: str, feed: _Feed) -> None:
        if self._streams.has(turn_id):
            async with feed.changed:
                feed.local = True
                feed.changed.notify_all()
            return
        final: StreamEvent | None = None
        async with self._sessions() as session:
            turn = await session.get(Turn, turn_id)
            if turn is not None and turn.status in TurnStatus.FINAL:
                final = await stored_final_event(session, turn)
        async with feed.changed:
            if turn is None:
                feed.missing = True
            elif final is not None:
                feed.text = turn.reply_text or ""
                feed.final = final
            elif len(turn.reply_text or "") > len(feed.text):
                feed.text = turn.reply_text or ""
            else:
                return
            feed.changed.notify_all()


async def stored_final_event(session: AsyncSession, turn: Turn) -> StreamEvent:
    """A finished turn's last event, rebuilt from its row: equal to the live one."""
    coalesced: list[str] = []
    if turn.status == TurnStatus.DONE:
        coalesced = list(
            await session.scalars(
                select(Turn.id).where(Turn.coalesced_into == turn.id).order_by(Turn.seq)
            )
        )
    kind, data = final_event(turn.id, end_of_row(turn, coalesced))
    return StreamEvent(kind, kind, data)
