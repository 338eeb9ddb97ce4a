"""Running turns' replies so far, kept in their rows for readers on other workers.

With several workers (PostgreSQL) the client reading a turn's stream may be
connected to a worker that is not running the turn: a reconnect that the load
balancer sent elsewhere, or a message that waited behind a turn another worker
was running. Such a reader polls the turn row (``bot.channels.api.routes``);
saving the reply so far every ``PARTIAL_REPLY_INTERVAL_S`` lets it stream in
steps of about that size instead of getting the whole reply at the end.

A worker saves the replies of all its running turns together, one statement
each interval, however many turns generate. One save a turn each (the ping and
the UPDATE) was more than half of a worker's round trips to PostgreSQL under
load (``bench/load.py``: some 8,000 in an 8 s run at 100 messages/s, each a
wake-up of a database process on the cores the event loop acknowledging
messages needs).

The write is fenced like every write of a running turn: a turn's reply only
lands while it is running under this worker's lease. A single process (SQLite)
streams every reader from memory and does not need it.

Each save holds the reply's text, its token ids and where its platform message
is (``ReplySnapshot``), taken together: a worker that takes the turn over when
this one dies continues from exactly them (``bot.turns.resumption``). The runner
delivers only text a save has stored (docs/replies.md), so a turn's first text
is saved at once (``save_now``) rather than at the next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy import ARRAY, LargeBinary, String, Text, bindparam, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.db import create_statement_sessionmaker
from bot.storage.models import Turn, TurnStatus
from bot.storage.tokens import pack_token_ids
from bot.turns.cancellation import stop_requested

log = structlog.get_logger(__name__)

PARTIAL_REPLY_INTERVAL_S = 0.5
SAVE_NOW_WAIT_S = 0.5
"""How long a turn waits for a save it asked for at once (a round trip, normally). A database
that holds the save up longer (a locked table) must not hold up the turn's end as well: the
save goes on by itself, and the final write, retried, stores the whole reply anyway."""


@dataclass(frozen=True)
class ReplySnapshot:
    """A running turn's reply at one moment: its text, the token ids of that text (with any
    bytes of a character not complete yet), and where its platform message is."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    delivery: dict[str, Any] | None = None

    def changed_from(self, other: ReplySnapshot) -> bool:
        return (
            self.text != other.text
            or len(self.token_ids) != len(other.token_ids)
            or self.delivery != other.delivery
        )


@dataclass
class _Running:
    """A turn whose reply is being saved: where its snapshot comes from, what was stored."""

    reply_so_far: Callable[[], ReplySnapshot]
    on_lost: Callable[[], object] | None
    on_saved: Callable[[ReplySnapshot], object] | None
    saved: ReplySnapshot = field(default_factory=ReplySnapshot)
    now: asyncio.Task[None] | None = None
    """A save asked for at once (``save_now``), while it is in flight."""


class PartialReplies:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        worker_id: str,
        interval_s: float = PARTIAL_REPLY_INTERVAL_S,
    ) -> None:
        self._sessions = create_statement_sessionmaker(sessions.kw["bind"])
        """Each save is one statement, outside a transaction (``save_all``)."""
        self.worker_id = worker_id
        self.interval_s = interval_s
        self._running: dict[str, _Running] = {}
        self._saver: asyncio.Task[None] | None = None
        """Saves every running turn's reply each interval while any runs here."""

    @contextlib.asynccontextmanager
    async def saving(
        self,
        turn_id: str,
        reply_so_far: Callable[[], ReplySnapshot],
        on_lost: Callable[[], object] | None = None,
        on_saved: Callable[[ReplySnapshot], object] | None = None,
        saved: ReplySnapshot | None = None,
    ) -> AsyncIterator[None]:
        """Save ``reply_so_far()`` with the others every interval while the block runs
        (when it changed).

        ``on_lost`` is called once if a save finds the turn no longer ours to write;
        ``on_saved`` with each snapshot once it is stored. ``saved``: what the row holds
        already (a turn taken over, a continuation).
        A save sent when the block ends is not waited for, nor cancelled (that would
        cost a cancel request and the pooled connection): the turn's final write
        stores the whole reply, and a save that lands after it finds the turn no
        longer running and changes nothing.
        """
        self._running[turn_id] = _Running(reply_so_far, on_lost, on_saved, saved or ReplySnapshot())
        if self._saver is None or self._saver.done():
            # A context of its own: not the log fields of the turn that happened to start it.
            self._saver = asyncio.create_task(
                self._save_while_running(), name="partial-replies", context=contextvars.Context()
            )
        try:
            yield
        finally:
            self._running.pop(turn_id, None)

    async def _save_while_running(self) -> None:
        while self._running:
            await asyncio.sleep(self.interval_s)
            changed: dict[str, tuple[_Running, ReplySnapshot]] = {}
            for turn_id, running in list(self._running.items()):
                reply = running.reply_so_far()
                if reply.changed_from(running.saved):
                    changed[turn_id] = (running, reply)
            if changed:
                await self._save_changed(changed)

    async def save_now(self, turn_id: str, *, wait_s: float = SAVE_NOW_WAIT_S) -> bool:
        """Save one running turn's reply now (its first text, its last), waiting at most
        ``wait_s`` for it; True once the reply as it is now is stored.

        A save already in flight is waited for, not sent again; one that takes longer
        is left to finish (not cancelled: that would cost a cancel request and the pooled
        connection, ``saving``).
        """
        running = self._running.get(turn_id)
        if running is None:
            return False
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            reply = running.reply_so_far()
            if not reply.changed_from(running.saved):
                return True
            if running.now is None or running.now.done():
                running.now = asyncio.create_task(
                    self._save_changed({turn_id: (running, reply)}),
                    name="partial-reply-now",
                    context=contextvars.Context(),
                )
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            await asyncio.wait({running.now}, timeout=remaining)
            if not running.now.done() or self._running.get(turn_id) is not running:
                return False
            if running.saved is not reply:
                await asyncio.sleep(0.05)  # skipped (its row held) or refused: not at once

    async def _save_changed(self, changed: Mapping[str, tuple[_Running, ReplySnapshot]]) -> None:
        try:
            stored = await self.save_all(
                {turn_id: reply for turn_id, (_, reply) in changed.items()}
            )
        except Exception as exc:  # a database blink costs readers one step, not the turns
            if stop_requested():
                raise
            log.warning(
                "partial_reply_not_saved",
                turns=len(changed),
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        for turn_id, (running, reply) in changed.items():
            if turn_id not in stored:
                continue  # its row was held (a final write, a cancel): the next interval
            if stored[turn_id]:
                if len(reply.text) >= len(running.saved.text):  # a slower save may land last
                    running.saved = reply
                    if running.on_saved is not None:
                        running.on_saved(reply)
            elif self._running.get(turn_id) is running:
                # Still generating here, and no longer ours (taken over) or running.
                log.warning("turn_lease_lost", turn_id=turn_id)
                del self._running[turn_id]
                if running.on_lost is not None:
                    running.on_lost()

    async def close(self) -> None:
        """Stop saving (the service's end: its turns have ended, or been given up)."""
        if self._saver is not None:
            self._saver.cancel()
            await asyncio.gather(self._saver, return_exceptions=True)

    async def save_all(self, replies: Mapping[str, ReplySnapshot]) -> dict[str, bool]:
        """Store each turn's reply so far (turn id -> text). For each turn whose row it
        locked, whether it stored it (False: not this worker's to write, another's lease,
        or no longer running); a turn missing was skipped, its row held by another.

        One statement outside a transaction (all or nothing on its own): the checkout's
        ping and the UPDATE, for every turn at once. It never waits for a row: holding the
        rows it has locked while waiting for one held elsewhere (a final write's) would
        hold up those turns' final writes in turn, and lock the rows in another order
        than the lease renewal, which locks them too (a deadlock). A skipped turn costs
        readers one step.
        """
        async with self._sessions() as session:
            result = await session.execute(
                _SAVE_ALL,
                {
                    "turn_ids": list(replies),
                    "reply_texts": [reply.text for reply in replies.values()],
                    "reply_ids": [pack_token_ids(reply.token_ids) for reply in replies.values()],
                    "deliveries": [
                        None if reply.delivery is None else json.dumps(reply.delivery)
                        for reply in replies.values()
                    ],
                    "running": TurnStatus.RUNNING,
                    "worker_id": self.worker_id,
                },
            )
        return {turn_id: bool(stored) for turn_id, stored in result}

    async def save(self, turn_id: str, reply: ReplySnapshot) -> bool:
        """Store one turn's reply so far; False when it is not ours to write (or skipped)."""
        return (await self.save_all({turn_id: reply})).get(turn_id, False)


_SAVE_ALL = text(
    f"WITH locked AS (SELECT id FROM {Turn.__tablename__} WHERE id = ANY(:turn_ids)"
    " FOR NO KEY UPDATE SKIP LOCKED),"
    f" saved AS (UPDATE {Turn.__tablename__} SET reply_text = replies.reply_text,"
    " reply_token_ids = replies.reply_ids, delivery = CAST(replies.delivery AS JSON)"
    " FROM unnest(:turn_ids, :reply_texts, :reply_ids, :deliveries)"
    " AS replies(turn_id, reply_text, reply_ids, delivery)"
    f" WHERE {Turn.__tablename__}.id = replies.turn_id"
    f" AND {Turn.__tablename__}.id IN (SELECT id FROM locked)"
    f" AND {Turn.__tablename__}.status = :running"
    f" AND {Turn.__tablename__}.lease_owner = :worker_id"
    f" RETURNING {Turn.__tablename__}.id)"
    " SELECT locked.id, saved.id IS NOT NULL FROM locked LEFT JOIN saved ON saved.id = locked.id"
).bindparams(
    bindparam("turn_ids", type_=ARRAY(String)),
    bindparam("reply_texts", type_=ARRAY(Text)),
    bindparam("reply_ids", type_=ARRAY(LargeBinary)),
    bindparam("deliveries", type_=ARRAY(Text)),
    bindparam("running", type_=String),
    bindparam("worker_id", type_=String),
)
"""The fenced save of running turns' replies so far, all in one statement, skipping rows
held elsewhere; each row it locked and whether it stored it. Built once."""
