"""How every turn ends: one place for its final row, its stream's last event and its log line.

A turn ends in one of a few ways: the runner finishes or fails it, a stop
request drops it while queued, another turn answers it (coalescing), a
worker takes over a turn whose worker died, or the watchdog fails a turn
left ``running`` with no live generation. Whichever it is, the ending is one
``TurnEnd`` value, and the same three things follow from it:

* the row: ``apply_to_row`` sets every final column, always the same way;
* the announcement: the stream's ``done``/``error`` event (built by
  ``final_event``, which also rebuilds it from a stored row, so a replayed
  event equals the live one), the canonical ``turn`` log line, and the same
  fields to every observer (metrics). Announced only by whoever moved the row
  to its final status, so there is exactly one ``turn`` line per turn;
* for the runner, the write itself is retried with backoff
  (``TurnEndings.finish``): a database that blinks, a lock held by another
  session or a dropped connection must not leave a turn ``running`` for
  good. If it still fails, the turn is failed visibly: readers get ``error``,
  the user an apology, and the turn id is reported as abandoned so that the
  claims watchdog fails its row once the database answers again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog
from sqlalchemy import bindparam, insert, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.errors import USER_MESSAGES, ErrorClass
from bot.storage import in_place
from bot.storage.known_paths import KnownPaths
from bot.storage.models import Conversation, Message, Turn, TurnStatus, none_of, table_of
from bot.storage.text import storable
from bot.turns.finished import FinishedTurn, InFinalWrite
from bot.turns.replies import ReplySink
from bot.turns.streams import TurnStreams

log = structlog.get_logger("bot.turn")

TurnObserver = Callable[[dict[str, Any]], None]
"""Called with the fields of every canonical ``turn`` line (metrics hook in here)."""

FINAL_WRITE_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
"""Pauses between attempts of a final write: about 4 s of patience in all."""
FINAL_WRITE_ATTEMPT_TIMEOUT_S = 5.0
"""One attempt may wait this long (a row or table locked by another session)."""
STOPPED_MESSAGE = "Stopped."


def usage(
    prompt_tokens: int | None, cached_tokens: int | None, completion_tokens: int | None
) -> dict[str, int | None]:
    """The ``usage`` of a turn: ``new_tokens`` is the part of the prompt the engine computed."""
    new = None
    if prompt_tokens is not None and cached_tokens is not None:
        new = prompt_tokens - cached_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "new_tokens": new,
        "completion_tokens": completion_tokens,
    }


@dataclasses.dataclass
class TurnEnd:
    """Everything a finished turn records, whichever way it ended."""

    status: str
    text: str = ""
    error_class: ErrorClass | None = None
    error_message: str | None = None
    """For operators (row, log); the user is told ``USER_MESSAGES[error_class]``."""
    hint: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    timings_ms: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Per-layer milliseconds plus ``ttft`` and ``e2e``, as stored in ``turns.layer_ms``."""
    compaction_id: str | None = None
    coalesced: list[str] = dataclasses.field(default_factory=list)
    """Queued turns this one answered too."""
    coalesced_into: str | None = None
    log_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Facts for the log line only (who took a turn over, why the watchdog fired)."""
    resumes: int = 0
    """Times its reply was continued from its saved ids (``bot.turns.resumption``)."""

    @classmethod
    def failed(cls, error_class: ErrorClass, message: str, **fields: Any) -> TurnEnd:
        return cls(TurnStatus.FAILED, error_class=error_class, error_message=message, **fields)

    @property
    def user_message(self) -> str:
        if self.error_class is None:
            return ""
        if self.error_class == ErrorClass.CANCELLED:
            return STOPPED_MESSAGE
        return USER_MESSAGES[self.error_class]

    @property
    def usage(self) -> dict[str, int | None]:
        return usage(self.prompt_tokens, self.cached_tokens, self.completion_tokens)

    @property
    def links(self) -> dict[str, Any]:
        """How this turn relates to others, where it does: the compaction it started, the
        turns it answered together with its own, the turn that answered it."""
        related: dict[str, Any] = {}
        if self.compaction_id is not None:
            related["compaction_id"] = self.compaction_id
        if self.coalesced:
            related["coalesced"] = list(self.coalesced)
        if self.coalesced_into is not None:
            # Answered by another turn: its reply is on that turn's stream.
            related["coalesced_into"] = self.coalesced_into
        return related

    def without_history(self, error_class: ErrorClass, message: str) -> TurnEnd:
        """The same turn, failed: what is recorded when its real ending cannot be stored."""
        return dataclasses.replace(
            self,
            status=TurnStatus.FAILED,
            error_class=error_class,
            error_message=message,
            hint=None,
        )


def end_of_row(turn: Turn, coalesced: Sequence[str] = ()) -> TurnEnd:
    """The ending a stored final row records (for readers that come late)."""
    return TurnEnd(
        status=turn.status,
        text=turn.reply_text or "",
        error_class=ErrorClass(turn.error_class) if turn.error_class else None,
        error_message=turn.error_message,
        prompt_tokens=turn.prompt_tokens,
        cached_tokens=turn.cached_tokens,
        completion_tokens=turn.completion_tokens,
        finish_reason=turn.finish_reason,
        timings_ms=dict(turn.layer_ms or {}),
        compaction_id=turn.compaction_id,
        coalesced=list(coalesced),
        coalesced_into=turn.coalesced_into,
    )


def final_event(turn_id: str, end: TurnEnd) -> tuple[str, dict[str, Any]]:
    """The stream's last event: ``("done", data)`` or ``("error", data)``."""
    if end.status == TurnStatus.DONE:
        data: dict[str, Any] = {
            "turn_id": turn_id,
            "text": end.text,
            "usage": end.usage,
            "finish_reason": end.finish_reason,
            "timings_ms": dict(end.timings_ms),
            **end.links,
        }
        return "done", data
    error_class = end.error_class or ErrorClass.INTERNAL
    return "error", {
        "turn_id": turn_id,
        "error_class": error_class.value,
        "message": end.user_message or USER_MESSAGES[ErrorClass.INTERNAL],
    }


def final_columns(end: TurnEnd, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """Every final column of a turn row, from ``end``: the one definition of a final row."""
    return {
        "status": end.status,
        "lease_owner": None,
        "lease_expires_at": None,
        "reply_text": storable(end.text),
        "prompt_tokens": end.prompt_tokens,
        "cached_tokens": end.cached_tokens,
        "completion_tokens": end.completion_tokens,
        "finish_reason": end.finish_reason,
        "layer_ms": dict(end.timings_ms),
        "finished_at": now or dt.datetime.now(dt.UTC),
        "compaction_id": end.compaction_id,
        "coalesced_into": end.coalesced_into,
        "error_class": end.error_class.value if end.error_class else None,
        "error_message": storable(end.error_message) if end.error_message else None,
        "resumes": end.resumes,
        # A done reply's ids are in its history entry: the running turn's copy goes.
        "reply_token_ids": None,
        "delivery": None,
    }


# Built once, with bound parameters: every turn ends with them, on the event loop.
_TURNS = table_of(Turn)
_FINISH = (
    update(_TURNS)
    .where(_TURNS.c.id == bindparam("turn_id"), none_of(_TURNS.c.status, TurnStatus.FINAL))
    .values({name: bindparam(f"final_{name}") for name in final_columns(TurnEnd(TurnStatus.DONE))})
    .returning(*(_TURNS.c[field.name] for field in dataclasses.fields(FinishedTurn)))
)
"""The one final status, only if the turn has none yet (another worker may have failed it).

The table's UPDATE, not the ORM's: it returns the few columns ``FinishedTurn`` names,
loads no ``Turn``."""
_INSERT_ENTRIES = insert(table_of(Message))
"""The table's INSERT, not the ORM's: one executemany, no bulk machinery in between."""
_CONVERSATIONS = table_of(Conversation)
_MOVE_HEAD = (
    update(_CONVERSATIONS)
    .where(_CONVERSATIONS.c.id == bindparam("conversation_id"))
    .values(head_seq=bindparam("new_head_seq"))
)
"""The table's UPDATE, not the ORM's: it loads nothing, and the ORM's bulk-update path
cost more than the statement."""


def apply_to_row(row: Turn, end: TurnEnd, *, now: dt.datetime | None = None) -> None:
    """Set every final column of ``row`` from ``end`` (the caller holds the row's lock)."""
    for name, value in final_columns(end, now=now).items():
        setattr(row, name, value)


class TurnEndings:
    """Ends turns: writes (with retries, for the runner), then announces, once per turn."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        streams: TurnStreams,
        observers: Sequence[TurnObserver] = (),
        *,
        backoff_s: Sequence[float] = FINAL_WRITE_BACKOFF_S,
        attempt_timeout_s: float = FINAL_WRITE_ATTEMPT_TIMEOUT_S,
    ) -> None:
        self._sessions = sessions
        self._streams = streams
        self.observers: list[TurnObserver] = list(observers)
        self._backoff_s = tuple(backoff_s)
        self._attempt_timeout_s = attempt_timeout_s
        self.abandoned: set[str] = set()
        """Turns whose ending could not be stored: their rows still say ``running``."""

    async def finish(
        self,
        turn: Turn,
        end: TurnEnd,
        *,
        sink: ReplySink | None = None,
        history: Sequence[Message] = (),
        charge: InFinalWrite | None = None,
        known: KnownPaths | None = None,
    ) -> None:
        """End a turn this process ran: final write (retried), announcement, apology.

        Never raises. ``history`` (the turn's user and assistant entries) is
        stored with a done turn in the same transaction as its final status,
        and once committed ends the conversation's path in ``known``.
        The apology comes last: a worker that dies before it leaves a final row
        (a takeover never apologises a second time), and a slow platform holds
        up neither the stream's last event nor the log line.
        """
        try:
            stored = await self._store_with_retries(turn.id, end, history, charge, known)
        except Exception as exc:
            log.error(
                "turn_final_write_failed",
                turn_id=turn.id,
                conversation_id=turn.conversation_id,
                error=_describe(exc),
            )
            # Failed, also when the reply reached the user but not the history.
            end = end.without_history(ErrorClass.INTERNAL, f"final write failed: {_describe(exc)}")
            stored = await self._store_failure_instead(turn.id, end)
        if stored is not None:
            # Ended elsewhere first (taken over, deleted): readers get that ending, once.
            await self._close_stream(turn.id, stored)
            return
        # Not stored at all: failed visibly all the same; the watchdog records it later,
        # without a second line.
        await self.announce(turn, end, recorded=turn.id not in self.abandoned)
        if end.status == TurnStatus.FAILED:
            await self.apologise(sink, end)

    async def _store_failure_instead(self, turn_id: str, failed: TurnEnd) -> TurnEnd | None:
        """The real ending could not be stored: record the turn as failed, without history."""
        try:
            return await self._store_with_retries(turn_id, failed, (), None, None)
        except Exception as again:
            # Nothing could be written: the watchdog fails the row once the database is back.
            self.abandoned.add(turn_id)
            log.error("turn_abandoned", turn_id=turn_id, error=_describe(again))
            return None

    async def _store_with_retries(
        self,
        turn_id: str,
        end: TurnEnd,
        history: Sequence[Message],
        charge: InFinalWrite | None,
        known: KnownPaths | None,
    ) -> TurnEnd | None:
        """Store ``end``; None when written, else the ending another path stored first."""
        for attempt, pause in enumerate((*self._backoff_s, None)):
            try:
                async with asyncio.timeout(self._attempt_timeout_s):
                    return await self._store(turn_id, end, history, charge, known)
            except Exception as exc:
                if pause is None:
                    raise
                log.warning("turn_final_write_retry", attempt=attempt + 1, error=_describe(exc))
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _store(
        self,
        turn_id: str,
        end: TurnEnd,
        history: Sequence[Message],
        charge: InFinalWrite | None,
        known: KnownPaths | None,
    ) -> TurnEnd | None:
        stored_history = ""  # the conversation whose entries this write adds
        async with self._sessions() as session, session.begin():
            # One locking statement settles the one final status: a turn another worker
            # took over (our lease ran out) is already final and is not updated. No read
            # before it: the write lock (SQLite) is held one round trip less.
            final = {f"final_{name}": value for name, value in final_columns(end).items()}
            connection = await session.connection()
            returned = await in_place.execute(connection, _FINISH, {"turn_id": turn_id, **final})
            if not returned:
                ended = await session.get(Turn, turn_id)
                if ended is None:
                    return TurnEnd.failed(ErrorClass.CANCELLED, "deleted while running")
                return end_of_row(ended)
            row = FinishedTurn(*returned[0])
            adds_history = end.status == TurnStatus.DONE and bool(history)
            if adds_history:
                # Core statements on the session's connection: one executemany for every
                # entry (the ORM would send one per row), and no ORM execution around them.
                await in_place.execute_many(connection, _INSERT_ENTRIES, _entry_rows(history))
            if charge is not None:
                await charge(session, row)
            if adds_history:
                # The turn's reply becomes the active branch's end (``Message``). Last: the
                # conversation's row stays locked until the commit, and the conversation's
                # next accept (its turn number) waits for it.
                await in_place.execute(
                    connection,
                    _MOVE_HEAD,
                    {"conversation_id": row.conversation_id, "new_head_seq": history[-1].seq},
                )
                stored_history = row.conversation_id
        if stored_history and known is not None:
            # Committed: the conversation's next turn reads its head and nothing more.
            known.extend(stored_history, history)
        return None

    async def apologise(
        self, sink: ReplySink | None, end: TurnEnd, *, message: str | None = None
    ) -> None:
        """Tell the user the turn failed, where the platform allows it. Never raises."""
        if sink is None or end.error_class is None:
            return
        try:
            await sink.fail(end.error_class, message or end.user_message)
        except Exception as exc:  # the apology itself could not be delivered
            log.warning("apology_not_delivered", error=_describe(exc))

    async def announce(self, turn: Turn, end: TurnEnd, *, recorded: bool = True) -> None:
        """After the row is final: the stream's last event, the ``turn`` line, the observers."""
        await self._close_stream(turn.id, end)
        fields: dict[str, Any] = {
            "turn_id": turn.id,
            "conversation_id": turn.conversation_id,
            "status": end.status,
            "channel": turn.channel,
        }
        if not recorded:
            fields["recorded"] = False
        if end.status == TurnStatus.FAILED:
            fields["error_class"] = (end.error_class or ErrorClass.INTERNAL).value
            fields["error"] = end.error_message
            if end.hint:
                fields["hint"] = end.hint
        else:
            fields["finish_reason"] = end.finish_reason
        fields.update(end.usage)
        fields["resumed"] = end.resumes
        timings = dict(end.timings_ms)
        ttft, e2e = timings.pop("ttft", None), timings.pop("e2e", None)
        fields.update(layer_ms=timings, ttft_ms=ttft, e2e_ms=e2e)
        fields.update(end.links)
        fields.update(end.log_fields)
        log.info("turn", **fields)
        for observer in self.observers:
            try:
                observer(fields)
            except Exception:
                log.exception("turn_observer_failed")

    async def _close_stream(self, turn_id: str, end: TurnEnd) -> None:
        kind, data = final_event(turn_id, end)
        await self._streams.close(turn_id, kind, data)


def _entry_rows(entries: Sequence[Message]) -> list[dict[str, Any]]:
    """The history entries as plain rows: an attempt's rollback leaves nothing to reuse."""
    return [
        {
            "conversation_id": m.conversation_id,
            "seq": m.seq,
            "role": m.role,
            "text": storable(m.text),
            "token_ids": m.token_ids,
            "turn_id": m.turn_id,
            "parent_seq": m.parent_seq,
        }
        for m in entries
    ]


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def timings_of(
    layer_ms: Mapping[str, float], ttft_ms: float | None, e2e_ms: float
) -> dict[str, Any]:
    """``turns.layer_ms`` as stored: the layers, then ``ttft`` and ``e2e``."""
    return {**layer_ms, "ttft": ttft_ms, "e2e": e2e_ms}
