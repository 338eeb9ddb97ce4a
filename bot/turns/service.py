"""Accepts inbound messages as turns and runs them: in order per conversation, concurrently across.

``accept`` stores the inbound event and a queued turn in one transaction and
returns at once; a per-conversation worker task then runs the conversation's
queued turns one after another, so a message always waits for the reply to
the one before it, while different conversations run side by side (and vLLM
batches them). A message to a conversation with nothing open is stored
running and begun at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from bot.errors import ErrorClass
from bot.storage import conversations, exchanges, new_turns, turn_reads
from bot.storage.db import create_statement_sessionmaker
from bot.storage.kept import KeptConnection
from bot.storage.models import InboundEvent, Turn, TurnStatus, new_id, utcnow
from bot.turns import wakeups
from bot.turns.branching import Edit, ForkRefused, fork_turn, latest_turn
from bot.turns.branching import activate as activate_branch
from bot.turns.cancellation import Cancellations
from bot.turns.carried import CarriedHistories, CarriedPlan, HistoryConflict
from bot.turns.claiming import TurnClaims
from bot.turns.claims import LocalClaims
from bot.turns.ending import TurnEnd, TurnEndings, apply_to_row
from bot.turns.idempotency import find_delivery, reuse_conflict
from bot.turns.inbound import InboundMessage
from bot.turns.limits import (
    FairUse,
    RateLimited,
    Refusal,
    stored_turn_subjects,
    subjects_for,
)
from bot.turns.personas import Personas
from bot.turns.replies import Channel, ReplySink, TurnAddress
from bot.turns.streams import TurnStreams

log = structlog.get_logger(__name__)

PERSIST_TIMINGS_KEPT = 10_000
FINAL_WRITE_TIMEOUT_S = 10.0
"""At shutdown, how long a stopped turn may take to record itself before it is cut off."""
DECLINED_KEPT = 10_000
EDIT_LOOKBACK_TURNS = 500
"""How far back an edited chat message is looked for among a conversation's turns."""
WORKER_RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Pauses before a crashed conversation worker starts again (the last one repeats)."""


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


@dataclass(frozen=True)
class BegunTurn:
    """A turn its accept stored running, for its conversation's worker to run first."""

    turn: Turn
    head: conversations.ConversationHead | None
    """The conversation's head, read in the accept's transaction: the history the turn
    answers (no head moves while a turn of the conversation is open: a branch switch is
    refused, a compaction is the turn's own)."""


class _PersonaConflictError(Exception):
    def __init__(self, conflict: PersonaConflict) -> None:
        super().__init__(conflict.reason)
        self.conflict = conflict


class UnknownChannel(Exception):
    pass


# inbound_events.event_id is VARCHAR(400); PostgreSQL counts characters.
EVENT_ID_MAX_CHARS = 400
EVENT_ID_HASH_PREFIX = "sha256:"


def api_event_id(owner: str, conversation_key: str, message_id: str) -> str:
    """Dedupe key of an HTTP API message: unique per owner, conversation and message id.

    The JSON array keeps short keys readable (and those already stored unchanged);
    a longer one (non-ASCII ids escape to six characters each) is replaced by its
    SHA-256, so any ids the API accepts fit the column.
    """
    key = json.dumps([owner, conversation_key, message_id], separators=(",", ":"))
    if len(key) <= EVENT_ID_MAX_CHARS:
        return key
    return EVENT_ID_HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


DIVISION_BY_ZERO = "22012"
"""PostgreSQL's SQLSTATE for ``place_turn``'s all or nothing, failing (``_place_at_once``)."""


class TurnService:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        streams: TurnStreams,
        *,
        turn_sessions: async_sessionmaker[AsyncSession] | None = None,
    ) -> None:
        """``sessions``: the requests' (accepts, edits, cancels); ``turn_sessions``: the
        turns' work, here their final writes (the same if not given; two pools on
        PostgreSQL, ``bot.storage.db.ServiceEngines``)."""
        self._sessions = sessions
        self._places_at_once = sessions.kw["bind"].dialect.name == "postgresql"
        """Accepts try ``_place_at_once`` first (PostgreSQL)."""
        self._statement_sessions = (
            create_statement_sessionmaker(sessions.kw["bind"]) if self._places_at_once else None
        )
        """``_place_at_once``'s: its statement runs outside a transaction."""
        self.streams = streams
        self.endings = TurnEndings(turn_sessions or sessions, streams)
        """How every turn ends (row, stream, log line); the runner and the claims share it."""
        self._channels: dict[str, Channel] = {}
        self._runner: TurnRunnerLike | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._active: dict[str, tuple[str, asyncio.Task[None]]] = {}
        # Persist time of accepted turns, handed to the runner when the turn starts.
        # Bounded: turns that never start here (coalesced, run by another worker)
        # would otherwise stay in it for ever.
        self._persist_ms: OrderedDict[str, float] = OrderedDict()
        self._accepting = True
        self._recovered = False
        """Set once ``recover`` has scheduled what an earlier run left: turns begin at
        their accept only after that (``_begins_at_accept``)."""
        self.claims: TurnClaims = LocalClaims(sessions)
        """Turn leases; the app replaces it with one configured for several workers."""
        self.runs_turns = True
        """False in an ingress-only process (``workers.run_turns``): it stores and announces
        the turns it accepts (``bot.turns.wakeups``) and the workers run them."""
        self.fair_use: FairUse | None = None
        self.personas: Personas | None = None
        """The configured personas; channels look names up here, the runner uses them."""
        self._apologies: set[asyncio.Task[None]] = set()
        self.cancellations = Cancellations()
        """Stop requests for the turns running here; the runner shares it."""
        # Deliveries answered with an apology instead of a turn: a platform's redelivery
        # of one of them (nothing was stored to deduplicate it by) is not answered again.
        self._declined: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.kept_accepts: KeptConnection | None = None
        """SQLite: the connection the accepts' transactions run on, one after another
        (``bot.storage.kept``); the app sets it, and closes it before its engines go."""
        self.carried: CarriedHistories | None = None
        """Matches and seeds the histories messages carry (``InboundMessage.carried``);
        the app sets it once the chat format is loaded."""

    # -- wiring ------------------------------------------------------------------------

    def register_channel(self, channel: Channel) -> None:
        self._channels[channel.name] = channel

    def set_runner(self, runner: TurnRunnerLike) -> None:
        self._runner = runner

    def open_reply(self, address: TurnAddress) -> ReplySink:
        name = address.channel.split(":", 1)[0]
        channel = self._channels.get(address.channel) or self._channels.get(name)
        if channel is None:
            raise UnknownChannel(f"no channel registered for {address.channel!r}")
        return channel.open_reply(address)

    # -- inbound -----------------------------------------------------------------------

    async def accept(self, message: InboundMessage) -> Accepted:
        """Store the message as a turn (deduplicated) and schedule it.

        One statement where it can (``_place_at_once``, PostgreSQL), else one
        transaction, and no read before either: a redelivery is rare, and the unique
        (channel, event_id) of its inbound event refuses it, after which it is looked
        up. The ack waits for nothing else.

        A turn this process can begin at once (``_begins_at_accept``) is stored
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
            return await self._find_duplicate(message) or self._refuse(message, exc.refusal)
        except _PersonaConflictError as exc:
            return await self._find_duplicate(message) or Accepted(
                "", "", duplicate=False, persona_conflict=exc.conflict
            )
        except IntegrityError:
            # The same delivery raced us (platform retry, second worker): theirs won.
            existing = await self._find_duplicate(message)
            if existing is None:
                raise
            return existing
        self._persist_ms[turn_id] = (time.perf_counter() - started) * 1000
        while len(self._persist_ms) > PERSIST_TIMINGS_KEPT:
            self._persist_ms.popitem(last=False)
        if self.claims.exclusive:
            # With several workers another one may run it: the runner opens the stream there.
            # The conversation was found by this owner: the turn is theirs.
            self.streams.open(turn_id, owner=message.owner)
        self.schedule(slot.conversation_id)
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
        if self.carried is None:
            raise RuntimeError("a carried history needs TurnService.carried")
        return await self.carried.plan(
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

        A turn stored running (``_begins_at_accept``) is handed to its conversation's
        worker once committed. ``rehearsal`` (``rehearse``): every statement runs, then
        all is rolled back by ``Rehearsed``, and no worker is started.
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
                    assert self.carried is not None and message.carried is not None
                    plan.placed = await self.carried.take_slot(
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
                if not rehearsal and self._begins_at_accept(slot.conversation_id):
                    row["status"] = TurnStatus.RUNNING
                    row["started_at"] = utcnow()
                    begun = self._start_worker(slot.conversation_id)
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
            await self.fair_use.admit(connection, _limit_subjects(message))

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
            admission = self.fair_use.admission(_limit_subjects(message))
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

    def _begins_at_accept(self, conversation_id: str) -> bool:
        """True when the turn being accepted can be stored running, begun by this process.

        Only where one process owns the database (``claims.exclusive``, SQLite),
        turns run here and no worker has this conversation: every turn of a
        conversation is then run by its one worker, which leaves only when none
        is open (``_work_once``), so this turn is its head. Not before ``recover``
        has scheduled what an earlier run left queued, nor while draining.
        """
        return (
            self.claims.exclusive
            and self.runs_turns
            and self._accepting
            and self._recovered
            and conversation_id not in self._workers
        )

    def _start_worker(self, conversation_id: str) -> asyncio.Future[BegunTurn | None]:
        """The conversation's worker, set up before the accept commits: it first runs the
        turn the returned future gives (None: the accept rolled back).

        Set up inside the accept's transaction, with no await in between, so that a
        second accept for the conversation finds the worker and stores its turn queued.
        """
        begun: asyncio.Future[BegunTurn | None] = asyncio.get_running_loop().create_future()
        self._workers[conversation_id] = asyncio.create_task(
            self._work(conversation_id, begun), name=f"conv-{conversation_id}"
        )
        return begun

    async def regenerate(self, turn_id: str, *, owner: str | None = None) -> Accepted:
        """Answer ``turn_id``'s message again, as a new attempt (``bot.turns.branching``).

        Raises ``ForkRefused`` (not the latest turn, not ended yet, conversation
        closed) and ``LookupError`` (no such turn, or not ``owner``'s).
        """
        return await self._fork(turn_id, owner=owner, edit=None, event=None)

    async def continue_reply(self, turn_id: str, *, owner: str | None = None) -> Accepted:
        """Carry on ``turn_id``'s reply, cut at the length limit, as a new attempt whose reply
        starts with it id for id (``bot.turns.resumption``). Raises like ``regenerate``."""
        return await self._fork(turn_id, owner=owner, edit=None, event=None, continues=True)

    async def edit(self, turn_id: str, edit: Edit, *, owner: str | None = None) -> Accepted:
        """Answer ``edit.text`` in place of ``turn_id``'s message, on a new branch."""
        return await self._fork(turn_id, owner=owner, edit=edit, event=None)

    async def regenerate_latest(
        self, *, channel: str, owner: str, conversation_key: str
    ) -> Accepted | None:
        """``/retry``: regenerate the open conversation's latest turn; None if it has none.

        Raises ``ForkRefused`` like ``regenerate`` (e.g. the reply is still being written).
        """
        async with self._sessions() as session:
            conversation = await conversations.find_open_conversation(
                session, owner=owner, channel=channel, external_key=conversation_key
            )
            target = None if conversation is None else await latest_turn(session, conversation)
        if target is None:
            return None
        return await self._fork(target.id, owner=owner, edit=None, event=None)

    async def accept_edit(self, message: InboundMessage, edited: Mapping[str, Any]) -> Accepted:
        """A chat platform's edit of an earlier message.

        ``edited`` is the edited message's address as the channel stores it in
        ``reply_to`` (a Telegram chat and message id). The latest turn's message:
        an edit (``bot.turns.branching``), deduplicated on the delivery's event id
        like ``accept``. A message no turn was made of (an unaddressed group
        message, now addressed): a new message. An older turn's message: raises
        ``ForkRefused``.
        """
        duplicate = await self._find_duplicate(message)
        if duplicate is not None:
            return duplicate
        async with self._sessions() as session:
            conversation = await conversations.find_open_conversation(
                session,
                owner=message.owner,
                channel=message.channel,
                external_key=message.conversation_key,
            )
            target = None if conversation is None else await latest_turn(session, conversation)
            addresses: list[dict[str, Any]] = []
            if conversation is not None:
                addresses = list(
                    (
                        await session.scalars(
                            select(Turn.reply_to)
                            .where(Turn.conversation_id == conversation.id)
                            .order_by(Turn.seq.desc())
                            .limit(EDIT_LOOKBACK_TURNS)
                        )
                    ).all()
                )

        def is_edited(address: Mapping[str, Any]) -> bool:
            return all(address.get(name) == value for name, value in edited.items())

        if target is not None and is_edited(target.reply_to):
            return await self._fork(
                target.id,
                owner=message.owner,
                edit=Edit(message.text, dict(message.reply_to)),
                event=message,
            )
        if any(is_edited(address) for address in addresses):
            raise ForkRefused("only the latest message can be edited")
        return await self.accept(message)

    async def _fork(
        self,
        turn_id: str,
        *,
        owner: str | None,
        edit: Edit | None,
        event: InboundMessage | None,
        continues: bool = False,
    ) -> Accepted:
        started = time.perf_counter()
        try:
            async with self._sessions() as session, session.begin():
                if owner is not None:
                    owned = await turn_reads.get_turn_for_owner(session, turn_id, owner)
                    target = owned[0] if owned is not None else None
                else:
                    target = await turn_reads.get_turn(session, turn_id)
                if target is None:
                    raise LookupError(turn_id)
                # Locks the conversation: the checks in fork_turn hold until commit. Before
                # fair use's take, as in every accept (``accept``: one order, no deadlock).
                seq = await conversations.allocate_turn_seq(session, target.conversation_id)
                if self.fair_use is not None:
                    subjects = await stored_turn_subjects(
                        session,
                        api_key_id=target.api_key_id,
                        channel=target.channel,
                        user_id=target.user_id,
                        conversation_id=target.conversation_id,
                    )
                    await self.fair_use.admit(await session.connection(), subjects)
                turn = await fork_turn(session, target, seq, edit=edit, continues=continues)
                session.add(turn)
                await session.flush()
                if event is not None:
                    session.add(
                        InboundEvent(
                            channel=event.channel,
                            event_id=event.event_id,
                            conversation_id=turn.conversation_id,
                            turn_id=turn.id,
                        )
                    )
                if not self.runs_turns:
                    await wakeups.announce(session, turn.conversation_id)
        except RateLimited as exc:
            return Accepted("", "", duplicate=False, rate_limited=exc.refusal)
        except IntegrityError:
            existing = await self._find_duplicate(event) if event is not None else None
            if existing is None:
                raise
            return existing
        self._persist_ms[turn.id] = (time.perf_counter() - started) * 1000
        if self.claims.exclusive:
            self.streams.open(turn.id)
        self.schedule(turn.conversation_id)
        return Accepted(
            turn.id,
            turn.conversation_id,
            duplicate=False,
            continued_chars=len(turn.reply_text or "") if continues else 0,
        )

    async def activate(self, turn_id: str, *, owner: str) -> int | None:
        """Make the branch through ``turn_id``'s reply active (``bot.turns.branching.activate``).

        None when the turn has no stored reply; ``ForkRefused`` while a turn of the
        conversation is still being answered (its reply would land on the old branch).
        """
        async with self._sessions() as session, session.begin():
            owned = await turn_reads.get_turn_for_owner(session, turn_id, owner)
            if owned is None:
                raise LookupError(turn_id)
            turn = owned[0]
            await conversations.allocate_turn_seq(session, turn.conversation_id)  # lock
            open_turn = await session.scalar(
                select(Turn.id).where(
                    Turn.conversation_id == turn.conversation_id,
                    Turn.status.in_((TurnStatus.QUEUED, TurnStatus.RUNNING)),
                )
            )
            if open_turn is not None:
                raise ForkRefused("a turn of this conversation is still being answered")
            return await activate_branch(session, turn)

    def _refuse(self, message: InboundMessage, refusal: Refusal) -> Accepted:
        """Over a fair-use limit: tell the user when to try again; store nothing."""
        log.info(
            "rate_limited",
            channel=message.channel,
            subject=refusal.subject,
            limit=refusal.limit,
            retry_after_s=refusal.retry_after_s,
        )
        self.decline(message, ErrorClass.RATE_LIMITED, refusal.user_message)
        return Accepted("", "", duplicate=False, rate_limited=refusal)

    def decline(self, message: InboundMessage, error_class: ErrorClass, user_message: str) -> None:
        """Tell the sender why their message gets no reply (too long, over a limit); store nothing.

        Chat platforms hear it from the bot, in the background; the HTTP API's sink
        is silent (its client already has the 400 or 429). Once per delivery.
        """
        delivery = (message.channel, message.event_id)
        if delivery in self._declined:
            log.info("duplicate_delivery", channel=message.channel, event_id=message.event_id)
            return
        self._declined[delivery] = None
        while len(self._declined) > DECLINED_KEPT:
            self._declined.popitem(last=False)
        task = asyncio.create_task(self._apologise(message, error_class, user_message))
        self._apologies.add(task)
        task.add_done_callback(self._apologies.discard)

    async def _apologise(
        self, message: InboundMessage, error_class: ErrorClass, user_message: str
    ) -> None:
        try:
            address = TurnAddress("", "", message.channel, dict(message.reply_to))
            await self.open_reply(address).fail(error_class, user_message)
        except Exception as exc:
            log.warning("apology_not_delivered", error=f"{type(exc).__name__}: {exc}")

    async def _find_duplicate(self, message: InboundMessage) -> Accepted | None:
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

    async def new_conversation(
        self, *, channel: str, owner: str, conversation_key: str, persona: str | None = None
    ) -> None:
        """Close the open conversation for this key; the next message starts a fresh history.

        With ``persona`` the fresh conversation is opened at once, with that persona, so
        the next message continues it (``/mode``).
        """
        async with self._sessions() as session, session.begin():
            await conversations.close_conversation(
                session, owner=owner, channel=channel, external_key=conversation_key
            )
            if persona is not None:
                await conversations.open_conversation(
                    session,
                    owner=owner,
                    channel=channel,
                    external_key=conversation_key,
                    persona=persona,
                )

    async def cancel_active(self, *, channel: str, owner: str, conversation_key: str) -> bool:
        """Stop the reply being generated in this conversation, if any."""
        async with self._sessions() as session:
            conversation = await conversations.open_conversation(
                session, owner=owner, channel=channel, external_key=conversation_key
            )
            await session.commit()
            running_id = None
            if not self.claims.exclusive and conversation.id not in self._active:
                # Perhaps running on another worker: ask that one to stop it.
                running_id = await session.scalar(
                    select(Turn.id).where(
                        Turn.conversation_id == conversation.id,
                        Turn.status == TurnStatus.RUNNING,
                    )
                )
        active = self._active.get(conversation.id)
        if active is not None:
            return self._cancel_here(active[0])
        return running_id is not None and await self.cancel_turn(running_id)

    def _runs_here(self, turn_id: str) -> bool:
        return any(running_id == turn_id for running_id, _ in self._active.values())

    def _cancel_here(self, turn_id: str) -> bool:
        """Stop ``turn_id`` if this process runs it (or is starting it)."""
        if not self._runs_here(turn_id):
            return False
        self.cancellations.request(turn_id)
        return True

    def _on_cancel_request(self, turn_id: str) -> bool:
        """Another worker asked to stop a turn running here: True the first time it is seen."""
        return self._runs_here(turn_id) and self.cancellations.request(turn_id)

    async def cancel_turn(self, turn_id: str) -> bool:
        """Cancel one turn: a running one is stopped, a queued one never runs.

        A turn running on another worker gets a cancel request, which that
        worker's poller carries out within ``workers.poll_interval_s``.
        """
        if self._cancel_here(turn_id):
            return True
        async with self._sessions() as session, session.begin():
            # Locked: the runner moves a turn from queued to running under the same lock.
            turn = await session.get(Turn, turn_id, with_for_update=True)
            if turn is None or turn.status in TurnStatus.FINAL:
                return False
            if turn.status == TurnStatus.RUNNING:
                if self._cancel_here(turn_id):
                    return True  # started here while we waited for the lock
                if self.claims.exclusive:
                    return False  # not running here, and nowhere else: a crash left it
                turn.cancel_requested_at = dt.datetime.now(dt.UTC)
                return True
            end = TurnEnd.failed(ErrorClass.CANCELLED, "cancelled before it started")
            apply_to_row(turn, end)
        await self.endings.announce(turn, end)
        return True

    # -- scheduling --------------------------------------------------------------------

    def schedule(self, conversation_id: str) -> None:
        if not self._accepting or not self.runs_turns:
            return
        self._dirty.add(conversation_id)
        if conversation_id not in self._workers:
            task = asyncio.create_task(self._work(conversation_id), name=f"conv-{conversation_id}")
            self._workers[conversation_id] = task

    async def _work(
        self, conversation_id: str, begun: asyncio.Future[BegunTurn | None] | None = None
    ) -> None:
        """Run the conversation's queued turns in order until none is left.

        ``begun``: a turn the accept stored running (``_start_worker``), run first.
        A failure here (the database refusing a claim or a turn's start) must
        not end the conversation: the worker logs it and starts again after a
        pause, so the conversation's next turn is still answered.
        """
        # The worker outlives the request that started it: do not log under its request id.
        structlog.contextvars.clear_contextvars()
        runner = self._runner
        assert runner is not None, "set_runner() before accepting turns"
        crashes = 0
        try:
            if begun is not None and (first := await begun) is not None:
                # Run even if draining began meanwhile: it is stored running, and a turn
                # left running with no generation would end as interrupted, not answered.
                self.claims.began_here(first.turn)
                await self._run(conversation_id, runner, first.turn, begun=first)
            while True:
                try:
                    if not await self._work_once(conversation_id, runner):
                        return
                    crashes = 0
                except Exception:
                    log.exception("conversation_worker_crashed", conversation_id=conversation_id)
                    pause = WORKER_RESTART_BACKOFF_S[
                        min(crashes, len(WORKER_RESTART_BACKOFF_S) - 1)
                    ]
                    crashes += 1
                    await asyncio.sleep(pause)
                    self._dirty.add(conversation_id)
                    if not self._accepting:
                        return
        finally:
            self._workers.pop(conversation_id, None)

    async def _work_once(self, conversation_id: str, runner: TurnRunnerLike) -> bool:
        """One pass over the conversation's queue; False once the worker may stop."""
        self._dirty.discard(conversation_id)
        # Draining (SIGTERM): start nothing new; queued turns stay queued
        # for the next start instead of being begun and then cancelled.
        while self._accepting:
            # The head turn, leased to this worker; None when it runs elsewhere.
            turn = await self.claims.claim_next(conversation_id)
            if turn is None:
                break
            await self._run(conversation_id, runner, turn)
        # No await between this check and the removal (in ``_work``): a concurrent
        # schedule() either saw this worker or will start a new one.
        return conversation_id in self._dirty and self._accepting

    async def _run(
        self,
        conversation_id: str,
        runner: TurnRunnerLike,
        turn: Turn,
        *,
        begun: BegunTurn | None = None,
    ) -> None:
        """Run one turn of the conversation to its end (``begun``: stored running already)."""
        task = asyncio.create_task(
            runner.run(
                turn.id,
                persist_ms=self._persist_ms.pop(turn.id, None),
                # A turn taken over from a dead worker is running already (``claims``).
                begun=begun.turn
                if begun
                else (turn if turn.status == TurnStatus.RUNNING else None),
                head=begun.head if begun else None,
            )
        )
        self._active[conversation_id] = (turn.id, task)
        try:
            # A cancelled turn ends its own task; the worker goes on.
            await asyncio.shield(task)
        finally:
            self._active.pop(conversation_id, None)
            self.cancellations.forget(turn.id)

    def live_turn_ids(self) -> set[str]:
        """Turns with a live generation (or final write) in this process."""
        return {turn_id for turn_id, _ in self._active.values()}

    async def recover(self) -> None:
        """At start-up: resume queued turns; fail turns a dead worker left half-done.

        Dead means: any earlier run on SQLite (single process), a lease run out
        on PostgreSQL. ``bot.turns.claims`` then keeps polling for such turns.
        """
        self.claims.bind(self.open_reply, self.endings, self.live_turn_ids)
        if not self.runs_turns:
            return  # the workers that run turns recover and poll; this process only accepts
        await self.claims.recover()
        for conversation_id in await self.claims.claimable_conversations():
            self.schedule(conversation_id)
        self.claims.start(self.schedule, self._on_cancel_request)
        self._recovered = True

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._active)

    async def wait_idle(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until every scheduled turn has finished (tests).

        A wait that gives up (``timeout``) leaves the work running: ``asyncio.wait``
        does not cancel what it waits for, as ``gather`` would have cancelled the
        conversations' workers and left their queued turns to the next claims poll.
        """
        async with asyncio.timeout(timeout):
            while self._workers or self._apologies:
                done, _ = await asyncio.wait([*self._workers.values(), *self._apologies])
                for task in done:  # retrieved here, as gather did: nothing logged at exit
                    _ = task.cancelled() or task.exception()

    async def shutdown(self, grace_s: float) -> int:
        """Stop scheduling; let running turns finish within ``grace_s``, cancel the rest.

        Returns how many running turns were cancelled. Queued turns stay queued
        and are resumed by the next start (``recover``).
        """
        self._accepting = False
        workers = list(self._workers.values())
        if not workers and not self._apologies:
            await self.claims.close()
            return 0
        # One grace period for everything still going: running turns and apologies.
        _, pending = await asyncio.wait([*workers, *self._apologies], timeout=grace_s)
        cancelled = 0
        for turn_id, task in list(self._active.values()):
            if not task.done() and self.cancellations.request(turn_id):
                cancelled += 1
        # A stopped turn still records itself as cancelled; give that a bounded moment.
        running = [task for _, task in self._active.values() if not task.done()]
        if running:
            _, stuck = await asyncio.wait(running, timeout=FINAL_WRITE_TIMEOUT_S)
            for task in stuck:
                task.cancel()
        for worker in pending:
            worker.cancel()
        await asyncio.gather(*workers, *self._apologies, return_exceptions=True)
        for _, task in list(self._active.values()):
            await asyncio.gather(task, return_exceptions=True)
        await self.claims.close()
        return cancelled


class Rehearsed(Exception):
    """Raised inside a rehearsed accept's transaction (``TurnService.rehearse``): roll it back."""


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
        raise _PersonaConflictError(PersonaConflict(slot.persona, message.persona))


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


def _limit_subjects(message: InboundMessage) -> list[str]:
    return subjects_for(
        api_key_id=message.api_key_id,
        channel=message.channel,
        user_id=message.user_id,
        conversation_key=message.conversation_key,
    )


class TurnRunnerLike(Protocol):
    """The runner as the service uses it (``bot.turns.runner.TurnRunner``)."""

    async def run(
        self,
        turn_id: str,
        *,
        persist_ms: float | None = None,
        begun: Turn | None = None,
        head: conversations.ConversationHead | None = None,
    ) -> None: ...
