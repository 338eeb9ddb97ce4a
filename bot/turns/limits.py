"""Fair use: messages per minute and tokens per day, per API key, platform user or conversation.

Subjects are ``key:<api key id>`` (HTTP API), ``user:<channel>:<user id>``
(chat platforms) and, for a message that names no user (a generic webhook's
without ``user_id``, a Telegram group's anonymous admin),
``conversation:<channel>:<conversation key>``: nothing goes uncounted. Limits
come from ``[limits]`` in the config, overridden per subject by ``botctl limits
set`` (table ``limit_overrides``); 0 means no limit.

Counters live in the database (``usage_counters``), so they survive restarts
and hold across workers. Each is one row per (subject, metric) with a fixed
window (the current UTC minute, the current UTC day) that an atomic upsert
resets when the window has moved on:

* a message is admitted by ``INSERT .. ON CONFLICT DO UPDATE .. WHERE value <
  limit RETURNING value``: no row back means the minute's allowance is spent,
  and two workers can never both take the last slot;
* tokens are charged when a turn ends (prompt tokens the engine computed, i.e.
  not served from the prefix cache, plus generated tokens) and checked when the
  next message arrives, so a turn in flight may overshoot the day's allowance once.
  A subject's day is spread over ``TOKEN_SHARDS`` rows, charged in turn and summed
  when read: the charge is part of a turn's final write, which holds the row it
  charges until it commits, and with one row every turn of an API key shared by
  many users would queue for it (and hold its conversation's row meanwhile, which
  that conversation's next accept waits for).

Refused messages are not stored at all: the same message may be sent again once
the window has passed.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    String,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal,
    or_,
    select,
    true,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from bot.storage import in_place
from bot.storage.models import Conversation, LimitOverride, UsageCounter, one_of, utcnow
from bot.storage.new_turns import Admission
from bot.turns.finished import FinishedTurn, InFinalWrite
from bot.turns.settings import LimitSettings

MESSAGES_PER_MINUTE = "messages_per_minute"
TOKENS_PER_DAY = "tokens_per_day"
TOKEN_SHARDS = 8
"""Rows a subject's day of tokens is spread over (``TOKENS_PER_DAY``, then ``.1`` to ``.7``)."""
TOKEN_METRICS = (TOKENS_PER_DAY, *(f"{TOKENS_PER_DAY}.{shard}" for shard in range(1, TOKEN_SHARDS)))
MINUTE_S = 60
DAY_S = 86_400

Clock = Callable[[], float]


@dataclass(frozen=True)
class Limits:
    messages_per_minute: int
    tokens_per_day: int


@dataclass(frozen=True)
class Refusal:
    subject: str
    limit: str
    """``messages_per_minute`` or ``tokens_per_day``."""
    retry_after_s: int

    @property
    def user_message(self) -> str:
        wait = describe_wait(self.retry_after_s)
        if self.limit == MESSAGES_PER_MINUTE:
            return f"Sorry, too many messages in a short time. Please try again in {wait}."
        return (
            f"Sorry, today's usage limit is reached. Please try again in {wait} "
            "(limits reset at 00:00 UTC)."
        )


class RateLimited(Exception):
    """Raised inside the accepting transaction so that nothing of the message is stored."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.limit)
        self.refusal = refusal


def describe_wait(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    if minutes < 90:
        return f"{minutes} minutes"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min"


def key_subject(api_key_id: str) -> str:
    return f"key:{api_key_id}"


def user_subject(channel: str, user_id: str) -> str:
    return f"user:{channel}:{user_id}"


SUBJECT_MAX_CHARS = 300
"""``usage_counters.subject`` and ``limit_overrides.subject`` hold this many characters."""


def conversation_subject(channel: str, conversation_key: str) -> str:
    """A conversation's subject; one whose key would not fit the column is named by the
    key's SHA-256 instead (no channel's key is that long today: ``bot.channels.ids``)."""
    subject = f"conversation:{channel}:{conversation_key}"
    if len(subject) <= SUBJECT_MAX_CHARS:
        return subject
    return f"conversation:{channel}:sha256:{hashlib.sha256(conversation_key.encode()).hexdigest()}"


def subjects_for(
    *,
    api_key_id: str | None,
    channel: str,
    user_id: str | None,
    conversation_key: str | None = None,
) -> list[str]:
    """Who a message counts against: its API key, else its platform user, else its
    conversation (``conversation_key``; none given: no one)."""
    if api_key_id:
        return [key_subject(api_key_id)]
    if user_id:
        return [user_subject(channel, user_id)]
    if conversation_key is not None:
        return [conversation_subject(channel, conversation_key)]
    return []


def counts_per_conversation(*, api_key_id: str | None, user_id: str | None) -> bool:
    """Whether a turn's tokens count against its conversation (``subjects_for``)."""
    return not api_key_id and not user_id


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


def _override(column: Any) -> Any:
    return select(column).where(LimitOverride.subject == _SUBJECT).scalar_subquery()


def _tokens_used() -> Any:
    """A subject's tokens on ``:day``: its shards' counters whose window is that day."""
    day = bindparam("day", type_=BigInteger)
    return (
        select(
            func.coalesce(
                func.sum(case((UsageCounter.window_start == day, UsageCounter.value), else_=0)),
                0,
            )
        )
        .where(UsageCounter.subject == _SUBJECT, one_of(UsageCounter.metric, TOKEN_METRICS))
        .scalar_subquery()
    )


# Built once, with bound parameters: an accept checks every subject, and building
# these anew cost more of the event loop than running them.
_SUBJECT = bindparam("subject", type_=String)
_STANDING = select(
    _override(LimitOverride.messages_per_minute),
    _override(LimitOverride.tokens_per_day),
    _tokens_used(),
)
"""A subject's overrides (NULL: the default) and its tokens today: one round trip."""


def _counting(statement: Any, *, window: Any, amount: Any, limit: Any | None) -> Any:
    """``statement``, an INSERT of a subject's counter row, as the upsert that adds ``amount``
    to the counter in the window starting ``window``.

    A counter whose window has passed starts again from ``amount``. With a ``limit``:
    only while the window's count is below it; no row back means the limit is spent.
    """
    return statement.on_conflict_do_update(
        index_elements=[UsageCounter.subject, UsageCounter.metric],
        set_={
            "value": case(
                (UsageCounter.window_start == window, UsageCounter.value + amount), else_=amount
            ),
            "window_start": window,
        },
        where=None
        if limit is None
        else or_(UsageCounter.window_start != window, UsageCounter.value < limit),
    ).returning(UsageCounter.value)


def _add_to_counter(insert: Any, metric: Any, *, limited: bool) -> Any:
    """Add ``:amount`` to a subject's ``metric`` in the window starting ``:window``;
    ``limited``: only while the window's count is below ``:limit`` (``_counting``)."""
    window = bindparam("window", type_=BigInteger)
    amount = bindparam("amount", type_=BigInteger)
    statement = insert(UsageCounter).values(
        subject=_SUBJECT, metric=metric, window_start=window, value=amount
    )
    limit = bindparam("limit", type_=BigInteger) if limited else None
    return _counting(statement, window=window, amount=amount, limit=limit)


def _by_dialect(metric: Any, *, limited: bool) -> dict[str, Any]:
    """The statement for each backend's INSERT (both know the same ON CONFLICT form)."""
    return {
        "postgresql": _add_to_counter(postgresql.insert, metric, limited=limited),
        "sqlite": _add_to_counter(sqlite.insert, metric, limited=limited),
    }


_TAKE_MESSAGE = _by_dialect(MESSAGES_PER_MINUTE, limited=True)
_CHARGE = _by_dialect(bindparam("metric", type_=String), limited=False)
"""Tokens added to one of a subject's ``TOKEN_METRICS`` (``:metric``)."""


def _standing_and_take() -> Any:
    """PostgreSQL: ``_STANDING`` and ``_TAKE_MESSAGE`` in one statement (one round trip).

    The take runs only where the subject has a message limit (its override, else
    ``:default_messages``), against that limit; its RETURNING comes back as a fourth
    column, NULL when nothing was taken.
    """
    standing = _STANDING.cte("standing")
    messages, _tokens, _used = standing.c
    limit = func.coalesce(messages, bindparam("default_messages", type_=BigInteger))
    window = bindparam("window", type_=BigInteger)
    one = literal(1, BigInteger)
    take = postgresql.insert(UsageCounter).from_select(
        ["subject", "metric", "window_start", "value"],
        select(_SUBJECT, literal(MESSAGES_PER_MINUTE), window, one).where(limit > 0),
    )
    taken = _counting(take, window=window, amount=one, limit=select(limit).scalar_subquery()).cte(
        "taken"
    )
    return select(*standing.c, select(taken.c.value).scalar_subquery())


_STANDING_AND_TAKE = _standing_and_take()


def _admitted_always(_slot: Any) -> Any:
    """A message that counts against no one (``_admitted_in``'s place)."""
    return true()


def _admitted_in(slot: Any) -> Any:
    """PostgreSQL: fair use's admission of a message, as a condition of the statement that
    stores its turn (``bot.storage.new_turns.place_turn``'s ``admission``).

    Where ``slot`` (the conversation's turn number, taken) has a row, the message takes
    one of the subject's minute's allowance (where it has a message limit) as in
    ``_standing_and_take``; the condition holds where the subject's tokens today are
    under its token limit (if any) and the take, if one was due, came back. Parameters:
    ``_standing_and_take``'s and ``:default_tokens``.
    """
    standing = _STANDING.cte("standing")
    messages, tokens, used = standing.c
    message_limit = select(
        func.coalesce(messages, bindparam("default_messages", type_=BigInteger))
    ).scalar_subquery()
    token_limit = select(
        func.coalesce(tokens, bindparam("default_tokens", type_=BigInteger))
    ).scalar_subquery()
    window = bindparam("window", type_=BigInteger)
    one = literal(1, BigInteger)
    take = postgresql.insert(UsageCounter).from_select(
        ["subject", "metric", "window_start", "value"],
        select(_SUBJECT, literal(MESSAGES_PER_MINUTE), window, one)
        .select_from(slot)
        .where(message_limit > 0),
    )
    taken = _counting(take, window=window, amount=one, limit=message_limit).cte("taken")
    return and_(
        or_(token_limit == 0, select(used).scalar_subquery() < token_limit),
        or_(message_limit == 0, exists(select(taken.c.value))),
    )


@dataclass(frozen=True)
class Standing:
    """Where a subject stands: its limits and the tokens it has used today."""

    limits: Limits
    tokens_used: int


class FairUse:
    def __init__(self, settings: LimitSettings, clock: Clock = time.time) -> None:
        self._defaults = Limits(settings.messages_per_minute, settings.tokens_per_day)
        self._clock = clock
        self._charges = itertools.count()
        """Which of a subject's ``TOKEN_METRICS`` a charge goes to: each in turn, so that
        the final writes in flight in a process charge different rows."""

    @property
    def defaults(self) -> Limits:
        return self._defaults

    async def standing(self, connection: AsyncConnection, subject: str, day: int) -> Standing:
        """``subject``'s limits (its override, else the default) and its tokens used on ``day``."""
        # On a connection, not through the ORM: the statement loads no objects, and the
        # ORM's way of running it cost the accept more than the statement did.
        rows = await in_place.execute(connection, _STANDING, {"subject": subject, "day": day})
        return self._standing(rows[0])

    def _standing(self, row: Any) -> Standing:
        """A ``_STANDING`` row (overrides, tokens used on its ``:day``): the standing."""
        messages, tokens, used = row[:3]
        limits = Limits(
            self._defaults.messages_per_minute if messages is None else int(messages),
            self._defaults.tokens_per_day if tokens is None else int(tokens),
        )
        return Standing(limits, int(used))

    def admission(self, subjects: list[str]) -> Admission | None:
        """``admit`` for the one subject of ``subjects``, inside the statement that stores
        the turn (PostgreSQL, ``bot.storage.new_turns.place_turn``): the turn is stored
        only if admitted, and a refusal is then told apart by ``admit``. None for
        more than one subject (``admit`` undoes a take when a later subject refuses).
        """
        if len(subjects) > 1:
            return None
        if not subjects:
            return Admission(_admitted_always, {})
        now = self._clock()
        return Admission(
            _admitted_in,
            {
                "subject": subjects[0],
                "day": int(now // DAY_S) * DAY_S,
                "window": int(now // MINUTE_S) * MINUTE_S,
                "default_messages": self._defaults.messages_per_minute,
                "default_tokens": self._defaults.tokens_per_day,
            },
        )

    async def admit(self, connection: AsyncConnection, subjects: list[str]) -> None:
        """Count one message against every subject, or raise ``RateLimited``.

        Call it inside the transaction that stores the message: a refusal raises
        out of it, which rolls back the counts already taken for other subjects.
        """
        now = self._clock()
        day = int(now // DAY_S) * DAY_S
        minute = int(now // MINUTE_S) * MINUTE_S
        for subject in subjects:
            standing, taken = await self._standing_and_take(connection, subject, day, minute)
            limits = standing.limits
            if limits.tokens_per_day and standing.tokens_used >= limits.tokens_per_day:
                raise RateLimited(
                    Refusal(subject, TOKENS_PER_DAY, max(1, math.ceil(day + DAY_S - now)))
                )
            if limits.messages_per_minute and not taken:
                raise RateLimited(
                    Refusal(
                        subject, MESSAGES_PER_MINUTE, max(1, math.ceil(minute + MINUTE_S - now))
                    )
                )

    async def _standing_and_take(
        self, connection: AsyncConnection, subject: str, day: int, minute: int
    ) -> tuple[Standing, bool]:
        """``subject``'s standing, and whether one message of its minute's allowance was
        taken (a subject with no message limit takes none). A take for a message then
        refused for its tokens is undone with the rest of the accept's transaction.

        On PostgreSQL one statement, one round trip (an accept waits for each); on
        SQLite, whose statements cost no round trip, the two it is made of.
        """
        if connection.dialect.name == "postgresql":
            row = (
                await connection.execute(
                    _STANDING_AND_TAKE,
                    {
                        "subject": subject,
                        "day": day,
                        "window": minute,
                        "default_messages": self._defaults.messages_per_minute,
                    },
                )
            ).one()
            return self._standing(row), row[3] is not None
        standing = await self.standing(connection, subject, day)
        limit = standing.limits.messages_per_minute
        return standing, bool(limit) and await self._take_message(
            connection, subject, minute, limit
        )

    async def _take_message(
        self, connection: AsyncConnection, subject: str, minute: int, limit: int
    ) -> bool:
        taken = await in_place.execute(
            connection,
            _TAKE_MESSAGE[connection.dialect.name],
            {"subject": subject, "window": minute, "amount": 1, "limit": limit},
        )
        return bool(taken)

    async def charge(self, session: AsyncSession, subjects: list[str], tokens: int) -> None:
        """Add a finished turn's tokens to each subject's day (atomic across workers)."""
        if tokens <= 0:
            return
        day = int(self._clock() // DAY_S) * DAY_S
        statement = _CHARGE[_dialect(session)]
        metric = TOKEN_METRICS[next(self._charges) % TOKEN_SHARDS]
        connection = await session.connection()  # not through the ORM, as in ``standing``
        for subject in subjects:
            await in_place.execute(
                connection,
                statement,
                {"subject": subject, "metric": metric, "window": day, "amount": tokens},
            )

    async def charge_turn(self, session: AsyncSession, turn: FinishedTurn) -> None:
        """Charge what the engine computed for ``turn``: uncached prompt + generated tokens."""
        prompt = turn.prompt_tokens or 0
        cached = min(turn.cached_tokens or 0, prompt)
        tokens = prompt - cached + (turn.completion_tokens or 0)
        if tokens <= 0:
            return
        subjects = await stored_turn_subjects(
            session,
            api_key_id=turn.api_key_id,
            channel=turn.channel,
            user_id=turn.user_id,
            conversation_id=turn.conversation_id,
        )
        await self.charge(session, subjects, tokens)


async def stored_turn_subjects(
    session: AsyncSession,
    *,
    api_key_id: str | None,
    channel: str,
    user_id: str | None,
    conversation_id: str,
) -> list[str]:
    """``subjects_for`` a stored turn: its conversation's key is read only when the turn
    counts against its conversation (rare: no key, no user), by primary key, rather
    than carried in every turn's final write."""
    key = None
    if counts_per_conversation(api_key_id=api_key_id, user_id=user_id):
        key = await conversation_key_of(session, conversation_id)
    return subjects_for(
        api_key_id=api_key_id, channel=channel, user_id=user_id, conversation_key=key
    )


_CONVERSATION_KEY = select(Conversation.external_key).where(
    Conversation.id == bindparam("conversation_id", type_=String)
)


async def conversation_key_of(session: AsyncSession, conversation_id: str) -> str | None:
    """A conversation's key in its channel (what its subject is named after)."""
    # On the connection, as ``charge``: it runs inside a turn's final write.
    rows = await in_place.execute(
        await session.connection(), _CONVERSATION_KEY, {"conversation_id": conversation_id}
    )
    return str(rows[0][0]) if rows else None


async def set_override(
    session: AsyncSession,
    subject: str,
    *,
    messages_per_minute: int | None,
    tokens_per_day: int | None,
) -> LimitOverride:
    override = await session.get(LimitOverride, subject)
    if override is None:
        override = LimitOverride(subject=subject)
        session.add(override)
    override.messages_per_minute = messages_per_minute
    override.tokens_per_day = tokens_per_day
    override.updated_at = utcnow()
    await session.flush()
    return override


async def clear_override(session: AsyncSession, subject: str) -> bool:
    override = await session.get(LimitOverride, subject)
    if override is None:
        return False
    await session.delete(override)
    return True


async def list_overrides(session: AsyncSession) -> list[LimitOverride]:
    return list(
        (await session.scalars(select(LimitOverride).order_by(LimitOverride.subject))).all()
    )


def charge_summary(fair_use: FairUse | None, tokens: int) -> InFinalWrite | None:
    """A compaction's summary charged to the turn's fair-use subjects, with the turn's end."""
    if fair_use is None or tokens <= 0:
        return None

    async def charge(session: AsyncSession, turn: FinishedTurn) -> None:
        subjects = subjects_for(
            api_key_id=turn.api_key_id, channel=turn.channel, user_id=turn.user_id
        )
        await fair_use.charge(session, subjects, tokens)

    return charge
