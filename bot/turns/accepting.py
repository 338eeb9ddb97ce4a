"""Accepts an inbound message as a turn: stored, with its inbound event, in one write.

``Accepts.accept`` stores the inbound event and a queued turn in one
transaction (one statement on PostgreSQL) and returns at once; the
conversation's worker (``bot.turns.conversation_workers``) runs it. A message
to a conversation with nothing open is stored running and begun at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from bot.errors import ErrorClass
from bot.storage import exchanges, new_turns
from bot.storage.db import create_statement_sessionmaker
from bot.storage.kept import KeptConnection
from bot.storage.models import Turn, TurnStatus, new_id, utcnow
from bot.turns import wakeups
from bot.turns.carried import CarriedHistories, CarriedPlan, HistoryConflict
from bot.turns.claiming import TurnClaims
from bot.turns.conversation_workers import BegunTurn, ConversationWorkers
from bot.turns.declines import Declines
from bot.turns.idempotency import find_delivery, reuse_conflict
from bot.turns.inbound import InboundMessage
from bot.turns.limits import FairUse, RateLimited, Refusal, subjects_for
from bot.turns.streams import TurnStreams

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Accepted:
    turn_id: str
    conversation_id: str
    duplicate: bool
    rate_limited: Refusal | None = None
    """Set when a fair-use limit refused the message: nothing was stored, try again later."""
    persona_conflict: PersonaConflict | None = None
    """Set when the message named a persona its existing conversation was not started with."""
    id_conflict: str | None = None
    """Set (the reason) on a ``duplicate`` whose id was stored with another message: the
    routes of client-chosen ids refuse it (``bot.turns.idempotency``)."""
    history_conflict: str | None = None
    """Set when the turn the message continues (``carried.previous``) has moved on: why."""
    continuation: str | None = None
    """How a carried history was placed (``bot.turns.carried.Continuation``)."""
    continued_chars: int = 0
    """A continuation of a cut reply: the characters of it its reply starts with."""


@dataclass(frozen=True)
class PersonaConflict:
    """A persona cannot change mid-conversation: nothing was stored."""

    conversation_persona: str | None
    requested: str

    @property
    def reason(self) -> str:
        current = self.conversation_persona or "the default"
        return (
            f"this conversation was started with {current} persona; a persona is chosen "
            "when a conversation starts and never changes (it opens the history every later "
            "prompt is built on): start a new conversation to use another"
        )


class PersonaConflictError(Exception):
    def __init__(self, conflict: PersonaConflict) -> None:
        super().__init__(conflict.reason)
        self.conflict = conflict


DIVISION_BY_ZERO = "22012"
"""PostgreSQL's SQLSTATE for ``place_turn``'s all or nothing, failing (``_place_at_once``)."""


class Accepts:
    """Stores inbound messages as turns (deduplicated, counted against fair use) and
    hands them to their conversations' workers."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        streams: TurnStreams,
        workers: ConversationWorkers,
        declines: Declines,
        *,
        claims: TurnClaims,
        runs_turns: bool,
        fair_use: FairUse | None,
        kept_accepts: KeptConnection | None,
    ) -> None:
        self._sessions = sessions
        self._places_at_once = sessions.kw["bind"].dialect.name == "postgresql"
        """Accepts try ``_place_at_once`` first (PostgreSQL)."""
        self._statement_sessions = (
            create_statement_sessionmaker(sessions.kw["bind"]) if self._places_at_once else None
        )
        """``_place_at_once``'s: its statement runs outside a transaction."""
        self.streams = streams
        self.workers = workers
        self._declines = declines
        self.claims = claims
        self.runs_turns = runs_turns
        """False in an ingress-only process (``workers.run_turns``): it stores and announces
        the turns it accepts (``bot.turns.wakeups``) and the workers run them."""
        self.fair_use = fair_use
        self.kept_accepts = kept_accepts
        """SQLite: the connection the accepts' transactions run on, one after another
        (``bot.storage.kept``), closed by the app before its engines go."""
        self._carried: CarriedHistories | None = None

    def set_carried(self, carried: CarriedHistories) -> None:
        """Matches and seeds the histories messages carry (``InboundMessage.carried``),
        once the chat format is loaded."""
        self._carried = carried

    async def accept(self, message: InboundMessage) -> Accepted:
        """Store the message as a turn (deduplicated) and schedule it.

        One statement where it can (``_place_at_once``, PostgreSQL), else one
        transaction, and no read before either: a redelivery is rare, and the unique
        (channel, event_id) of its inbound event refuses it, after which it is looked
        up. The ack waits for nothing else.

        A turn this process can begin at once (``ConversationWorkers.begins_at_accept``) is stored
        already running, and its conversation's worker runs it without a claim
        or a start of its own: on SQLite that is one write-lock transaction and
        one read fewer on the way to the first token.
        """
        started = time.perf_counter()
        row = _turn_row(message)
        turn_id = row["id"]
        plan = await self._plan_carried(message)
        try:
            slot = await self._store(message, row, plan=plan)
        except HistoryConflict as exc:
            return Accepted("", "", duplicate=False, history_conflict=exc.reason)
        except RateLimited as exc:
            # A redelivery of a message already accepted is acknowledged, never refused.
            return await self.find_duplicate(message) or self._refuse(message, exc.refusal)
        except PersonaConflictError as exc:
            return await self.find_duplicate(message) or Accepted(
                "", "", duplicate=False, persona_conflict=exc.conflict
            )
        except IntegrityError:
            # The same delivery raced us (platform retry, second worker): theirs won.
            existing = await self.find_duplicate(message)
            if existing is None:
                raise
            return existing
        self.workers.note_persisted(turn_id, (time.perf_counter() - started) * 1000)
        if self.claims.exclusive:
            # With several workers another one may run it: the runner opens the stream there.
            # The conversation was found by this owner: the turn is theirs.
            self.streams.open(turn_id, owner=message.owner)
        self.workers.schedule(slot.conversation_id)
        placed = plan.placed if plan is not None else None
        return Accepted(
            turn_id,
            slot.conversation_id,
            duplicate=False,
            continuation=placed.continuation.value if placed is not None else None,
        )

    async def _plan_carried(self, message: InboundMessage) -> CarriedPlan | None:
        """The history a message carries, matched (and rendered when new) before its
        accept's transaction: the transaction only checks the match still holds."""
        if message.carried is None:
            return None
        if self._carried is None:
            raise RuntimeError("a carried history needs Accepts.set_carried")
        return await self._carried.plan(
            owner=message.owner,
            scope=message.user_id,
            text=message.text,
            carried=message.carried,
        )

    async def _store(
        self,
        message: InboundMessage,
        row: dict[str, Any],
        *,
        rehearsal: bool = False,
        plan: CarriedPlan | None = None,
    ) -> new_turns.TurnSlot:
        """Store the message's turn ``row`` in its conversation (created for a key's first
        message), counted against fair use: the accept's writes, all or nothing.

        A turn stored running (``ConversationWorkers.begins_at_accept``) is handed to its
        conversation's worker once committed. ``rehearsal`` (``rehearse``): every statement
        runs, then all is rolled back by ``Rehearsed``, and no worker is started.
        """
        # An ingress-only process wakes the workers, at commit.
        announce_channel = None if self.runs_turns else wakeups.CHANNEL
        begun: asyncio.Future[BegunTurn | None] | None = None
        try:
            if plan is None:
                slot = await self._place_at_once(
                    message, row, announce_channel, rehearsal=rehearsal
                )
                if slot is not None:
                    return slot
            async with self._accept_transaction() as (session, connection):
                # SQLite has no one-statement placement (``new_turns.place_turn``), nor has
                # a carried history (its conversation is found, not named).
                placed = (
                    await _place_turn(session, message, row, announce_channel)
                    if session is not None and self._places_at_once and plan is None
                    else None
                )
                if placed is not None:
                    slot = placed.slot
                    if not placed.stored:
                        _refuse_other_persona(slot, message)
                    await self._admit(connection, message)
                    if rehearsal:
                        raise Rehearsed
                    return slot
                # SQLite, or a conversation another accept was creating: slot, then turn
                if plan is None:
                    slot = await new_turns.take_turn_slot(
                        connection,
                        owner=message.owner,
                        channel=message.channel,
                        external_key=message.conversation_key,
                        persona=message.persona,
                    )
                else:
                    assert self._carried is not None and message.carried is not None
                    plan.placed = await self._carried.take_slot(
                        connection,
                        owner=message.owner,
                        channel=message.channel,
                        carried=message.carried,
                        plan=plan,
                    )
                    slot = plan.placed.slot
                _refuse_other_persona(slot, message)
                await self._admit(connection, message)
                row["conversation_id"] = slot.conversation_id
                row["seq"] = slot.seq
                if not rehearsal and self.workers.begins_at_accept(slot.conversation_id):
                    row["status"] = TurnStatus.RUNNING
                    row["started_at"] = utcnow()
                    begun = self.workers.start_worker(slot.conversation_id)
                await new_turns.insert_turn(
                    connection, row, channel=message.channel, event_id=message.event_id
                )
                if plan is not None and plan.placed is not None:
                    assert message.carried is not None
                    await record_exchange(connection, message, row["id"], slot, plan)
                if announce_channel is not None:
                    await wakeups.announce(connection, slot.conversation_id)
                if rehearsal:
                    raise Rehearsed
            if begun is not None:
                # Committed: the worker runs it from here, with the columns just written
                # and the conversation's head as its slot was taken: its run reads no row
                # when the path to that head is known (the conversation's last turn ran here).
                begun.set_result(BegunTurn(Turn(**row), slot.head))
            return slot
        finally:
            if begun is not None and not begun.done():
                # Rolled back: nothing to run; the worker only looks for queued work.
                begun.set_result(None)

    @contextlib.asynccontextmanager
    async def _accept_transaction(
        self,
    ) -> AsyncIterator[tuple[AsyncSession | None, AsyncConnection]]:
        """The accept's transaction and its one connection (asked for once: each ask costs
        the session's bookkeeping, and the accept's statements run on it directly).

        On SQLite, the connection kept for the accepts (``bot.storage.kept``) and no
        session; on PostgreSQL a session's, for ``new_turns.place_turn``.
        """
        if self.kept_accepts is not None:
            async with self.kept_accepts.begin() as connection:
                yield None, connection
            return
        async with self._sessions() as session, session.begin():
            yield session, await session.connection()

    async def rehearse(self, message: InboundMessage) -> None:
        """Run an accept's statements for ``message`` and store nothing.

        A process's first accept compiles each of its statements (SQLAlchemy; on
        PostgreSQL asyncpg prepares them too): a new engine's first took 13.8 ms on
        SQLite and 43.2 on PostgreSQL, after a rehearsal 3.3 and 8.0, a warm engine's
        first message 1.5 and 5.9. ``message`` must be one no key can
        send (an owner of its own): every transaction is rolled back (on PostgreSQL the
        one statement's too, which runs outside one for a real message). The rehearsed
        row has the columns of a real message's (an API message's).
        """
        try:
            await self._store(message, _turn_row(message), rehearsal=True)
        except Rehearsed:
            return
        raise RuntimeError("a rehearsed accept found a conversation: the rehearsal's owner exists")

    async def _admit(self, connection: AsyncConnection, message: InboundMessage) -> None:
        """Count the message against its fair-use subjects in the accept's transaction, or
        raise ``RateLimited`` (which rolls every count back with the rest).

        After the conversation's row is locked (its turn number taken), never before: the
        one-statement accept (``_place_at_once``) locks the row, then the subject's
        counter, and locks taken in the other order here would deadlock with it (a burst
        on a new conversation: one message here, the next in one statement).
        """
        if self.fair_use is not None and not message.unlimited:
            await self.fair_use.admit(connection, limit_subjects(message))

    async def _place_at_once(
        self,
        message: InboundMessage,
        row: dict[str, Any],
        announce_channel: str | None,
        *,
        rehearsal: bool = False,
    ) -> new_turns.TurnSlot | None:
        """PostgreSQL: store the message's turn with one statement and no transaction.

        ``place_turn`` all or nothing, fair use's admission inside it, the key's
        conversation created for its first message: the checkout's ping and the
        statement, two round trips where the transaction takes five (BEGIN, fair use's
        statement, the turn's, COMMIT), or seven for a first message (the slot looked
        for, the conversation created). Under load every trip is a wait for the event
        loop while the accept holds a pooled connection (docs/performance.md, "What costs what").
        Returns the slot, or None when it does not apply (SQLite, several subjects to
        count against) or stored nothing: a refusal, another persona, a conversation
        another accept was creating. The transaction then tells those apart.

        ``rehearsal``: the statement runs in a transaction rolled back (outside one it
        would store the rehearsal's conversation and turn), and None is returned.
        """
        if self._statement_sessions is None:
            return None
        admission = None
        if self.fair_use is not None and not message.unlimited:
            admission = self.fair_use.admission(limit_subjects(message))
            if admission is None:
                return None
        try:
            # A rehearsal's in a transaction it rolls back: outside one it would store.
            sessions = self._sessions if rehearsal else self._statement_sessions
            async with sessions() as session:
                placed = await _place_turn(
                    session,
                    message,
                    row,
                    announce_channel,
                    admission=admission,
                    all_or_nothing=True,
                )
                if rehearsal:
                    await session.rollback()
                    return None
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != DIVISION_BY_ZERO:
                raise
            return None  # a slot taken for a turn not stored: the statement undid it all
        # (All or nothing: a slot taken for a turn not stored failed above.)
        return None if placed is None or not placed.stored else placed.slot

    def _refuse(self, message: InboundMessage, refusal: Refusal) -> Accepted:
        """Over a fair-use limit: tell the user when to try again; store nothing."""
        log.info(
            "rate_limited",
            channel=message.channel,
            subject=refusal.subject,
            limit=refusal.limit,
            retry_after_s=refusal.retry_after_s,
        )
        self._declines.decline(message, ErrorClass.RATE_LIMITED, refusal.user_message)
        return Accepted("", "", duplicate=False, rate_limited=refusal)

    async def find_duplicate(self, message: InboundMessage) -> Accepted | None:
        async with self._sessions() as session:
            stored = await find_delivery(session, message.channel, message.event_id)
        if stored is None:
            return None
        conflict = reuse_conflict(stored, message)
        log.info(
            "duplicate_delivery",
            channel=message.channel,
            event_id=message.event_id,
            other_message=conflict is not None,
        )
        return Accepted(
            stored.turn_id or "",
            stored.conversation_id or "",
            duplicate=True,
            id_conflict=conflict,
        )


class Rehearsed(Exception):
    """Raised inside a rehearsed accept's transaction (``Accepts.rehearse``): roll it back."""


def _turn_row(message: InboundMessage) -> dict[str, Any]:
    """A new turn's columns for ``message``, but its conversation and number.

    Every turn's row has the same columns, ``started_at`` included (set where it is
    stored running): the statement that inserts it is then one, compiled once.
    """
    return {
        "id": new_id(),
        "channel": message.channel,
        "reply_to": dict(message.reply_to),
        # Storable before it is ever tokenized (``InboundMessage``): the text and ids agree.
        "user_id": message.user_id,
        "user_name": message.user_name,
        "user_text": message.text,
        "api_key_id": message.api_key_id,
        "status": TurnStatus.QUEUED,
        "started_at": None,
        "layer_ms": dict(message.layer_ms),
        "created_at": dt.datetime.fromtimestamp(message.received_at, dt.UTC),
        "sampling": message.sampling.as_json() if message.sampling is not None else None,
    }


async def record_exchange(
    connection: AsyncConnection,
    message: InboundMessage,
    turn_id: str,
    slot: new_turns.TurnSlot,
    plan: CarriedPlan,
) -> None:
    """The row that finds a carried history's turn again, in its accept's transaction."""
    assert message.carried is not None and plan.placed is not None
    await exchanges.record(
        connection,
        turn_id=turn_id,
        conversation_id=slot.conversation_id,
        owner=message.owner,
        context_hash=plan.context,
        head_key=plan.head_key,
        exchange=message.carried.record,
        continued_turn_id=plan.placed.continued_turn_id,
    )


def _refuse_other_persona(slot: new_turns.TurnSlot, message: InboundMessage) -> None:
    """Raise when the message asks for a persona its conversation was not created with.

    Raised out of the accept's transaction: the turn number taken is rolled back.
    """
    if message.persona is not None and slot.persona != message.persona:
        raise PersonaConflictError(PersonaConflict(slot.persona, message.persona))


async def _place_turn(
    session: AsyncSession,
    message: InboundMessage,
    row: dict[str, Any],
    announce_channel: str | None,
    *,
    admission: new_turns.Admission | None = None,
    all_or_nothing: bool = False,
) -> new_turns.PlacedTurn | None:
    """``new_turns.place_turn`` for ``message``'s turn ``row`` (both ways of ``accept``)."""
    return await new_turns.place_turn(
        session,
        owner=message.owner,
        channel=message.channel,
        external_key=message.conversation_key,
        persona=message.persona,
        turn=row,
        event_channel=message.channel,
        event_id=message.event_id,
        announce_channel=announce_channel,
        admission=admission,
        all_or_nothing=all_or_nothing,
    )


def limit_subjects(message: InboundMessage) -> list[str]:
    return subjects_for(
        api_key_id=message.api_key_id,
        channel=message.channel,
        user_id=message.user_id,
        conversation_key=message.conversation_key,
    )
