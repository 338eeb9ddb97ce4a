"""Usage: turns and tokens per owner, channel and day, read from the stored turns.

Every turn row already carries what it cost (``prompt_tokens``, ``cached_tokens``,
``completion_tokens``), its status, its channel, its sender and when it arrived;
its conversation carries the owner (an API key's owner, a Telegram bot, a Slack
workspace, a webhook integration). So usage is one grouped query over those
rows, with nothing counted twice and nothing to keep in step.

Days are UTC calendar days of the turn's arrival (``created_at``), the same
days the fair-use token allowance resets on (``bot.turns.limits``). Only turns
in a final state count as turns (``done``, ``failed``, and ``stopped`` apart from
failed: ``bot.turns.status``); tokens are summed over whatever the rows hold.

Reads go through read-only sessions (``bot.storage.db.create_read_sessionmaker``):
on SQLite they never take the write lock, so a report over a long history does
not hold up the turns being written meanwhile.

"Counted against the limit" is the fair-use counter itself (uncached prompt
tokens plus generated ones, charged when a turn ends), not a sum over rows, so
``/stats`` shows exactly the figure a refusal is decided on.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.models import Conversation, Turn, TurnStatus
from bot.turns.limits import DAY_S, FairUse
from bot.turns.status import is_failed, is_stopped

Clock = Callable[[], float]


@dataclass(frozen=True)
class UsageQuery:
    """Which turns to count; every field left None matches all."""

    owner: str | None = None
    channels: tuple[str, ...] = ()
    """Only these channels (``api``, ``telegram:support``, ...); empty: every channel."""
    user_id: str | None = None
    api_key_id: str | None = None
    since: dt.datetime | None = None
    """Turns that arrived at or after this instant (timezone-aware)."""
    until: dt.datetime | None = None
    """Turns that arrived before this instant (timezone-aware)."""


@dataclass(frozen=True)
class UsageRow:
    """One group's usage: a UTC day, an owner, a channel (and a user, when grouped by user)."""

    day: dt.date
    owner: str
    channel: str
    turns_done: int
    turns_failed: int
    turns_stopped: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    user_id: str | None = None
    user_name: str | None = None

    @property
    def cache_share(self) -> float | None:
        """Share of prompt tokens served from the prefix cache; None without prompt tokens."""
        return cache_share(self.cached_tokens, self.prompt_tokens)

    def as_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "day": self.day.isoformat(),
            "owner": self.owner,
            "channel": self.channel,
            **_counts(self),
        }
        if self.user_id is not None:
            document["user_id"] = self.user_id
            document["user_name"] = self.user_name
        return document


@dataclass(frozen=True)
class Today:
    """One subject's usage today (UTC) and the daily token allowance that applies to it."""

    day: dt.date
    turns_done: int
    turns_failed: int
    turns_stopped: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    counted_tokens: int
    """Tokens charged against the daily limit today: uncached prompt + generated."""
    tokens_per_day: int
    """The daily limit that applies (0 = no limit)."""

    @property
    def cache_share(self) -> float | None:
        return cache_share(self.cached_tokens, self.prompt_tokens)

    def as_dict(self) -> dict[str, Any]:
        return {
            "day": self.day.isoformat(),
            **_counts(self),
            "counted_tokens": self.counted_tokens,
            "tokens_per_day": self.tokens_per_day,
        }


def _counts(usage: UsageRow | Today) -> dict[str, Any]:
    """The turn and token counts every usage report shows, in the order it shows them."""
    return {
        "turns_done": usage.turns_done,
        "turns_failed": usage.turns_failed,
        "turns_stopped": usage.turns_stopped,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "completion_tokens": usage.completion_tokens,
        "cache_share": usage.cache_share,
    }


def cache_share(cached: int, prompt: int) -> float | None:
    return min(cached, prompt) / prompt if prompt > 0 else None


def utc_day(now: float) -> tuple[dt.date, dt.datetime]:
    """The UTC day containing ``now`` and the instant it began."""
    start = dt.datetime.fromtimestamp(int(now // DAY_S) * DAY_S, dt.UTC)
    return start.date(), start


def _day_of(session: AsyncSession) -> ColumnElement[Any]:
    """The UTC calendar day of ``Turn.created_at``, in the session's SQL dialect.

    PostgreSQL would convert a ``timestamptz`` to the server's time zone for
    ``date()``, so it is taken in UTC explicitly; SQLite stores the UTC instant
    as text, whose date is its first ten characters.
    """
    if session.get_bind().dialect.name == "postgresql":
        return func.date(func.timezone("UTC", Turn.created_at))
    return func.date(Turn.created_at)


def _as_date(value: object) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value))


async def usage_rows(
    session: AsyncSession, query: UsageQuery, *, by_user: bool = False
) -> list[UsageRow]:
    """Usage grouped by UTC day, owner and channel (and user), oldest day first."""
    columns: list[Any] = [
        _day_of(session).label("day"),
        Conversation.owner.label("owner"),
        Turn.channel.label("channel"),
    ]
    if by_user:
        columns.append(Turn.user_id.label("user_id"))
    statement = (
        select(
            *columns,
            func.sum(case((Turn.status == TurnStatus.DONE, 1), else_=0)).label("done"),
            func.sum(case((is_failed(), 1), else_=0)).label("failed"),
            func.sum(case((is_stopped(), 1), else_=0)).label("stopped"),
            func.coalesce(func.sum(Turn.prompt_tokens), 0).label("prompt"),
            func.coalesce(func.sum(Turn.cached_tokens), 0).label("cached"),
            func.coalesce(func.sum(Turn.completion_tokens), 0).label("completion"),
            *([func.max(Turn.user_name).label("user_name")] if by_user else []),
        )
        .join(Conversation, Conversation.id == Turn.conversation_id)
        .group_by(*columns)
        .order_by(*columns)
    )
    if query.owner is not None:
        statement = statement.where(Conversation.owner == query.owner)
    if query.channels:
        statement = statement.where(Turn.channel.in_(query.channels))
    if query.user_id is not None:
        statement = statement.where(Turn.user_id == query.user_id)
    if query.api_key_id is not None:
        statement = statement.where(Turn.api_key_id == query.api_key_id)
    if query.since is not None:
        statement = statement.where(Turn.created_at >= query.since)
    if query.until is not None:
        statement = statement.where(Turn.created_at < query.until)
    rows: list[UsageRow] = []
    for row in (await session.execute(statement)).mappings():
        user_id, user_name = row.get("user_id"), row.get("user_name")
        rows.append(
            UsageRow(
                day=_as_date(row["day"]),
                owner=str(row["owner"]),
                channel=str(row["channel"]),
                turns_done=int(row["done"] or 0),
                turns_failed=int(row["failed"] or 0),
                turns_stopped=int(row["stopped"] or 0),
                prompt_tokens=int(row["prompt"]),
                cached_tokens=int(row["cached"]),
                completion_tokens=int(row["completion"]),
                user_id=None if user_id is None else str(user_id),
                user_name=None if user_name is None else str(user_name),
            )
        )
    return rows


class UsageReports:
    """Usage as the operator, a chat user and an API key's owner ask for it.

    ``fair_use`` is the service's own (its limits and counters); without it
    nothing is counted against a limit and every limit reads as 0 (none).
    """

    def __init__(
        self,
        read_sessions: async_sessionmaker[AsyncSession],
        fair_use: FairUse | None,
        clock: Clock = time.time,
    ) -> None:
        self._read_sessions = read_sessions
        self._fair_use = fair_use
        self._clock = clock

    async def rows(self, query: UsageQuery, *, by_user: bool = False) -> list[UsageRow]:
        async with self._read_sessions() as session:
            return await usage_rows(session, query, by_user=by_user)

    async def today(self, query: UsageQuery, *, subject: str) -> Today:
        """``query``'s turns today (UTC), and the fair-use ``subject``'s limit and charge."""
        now = self._clock()
        day, start = utc_day(now)
        todays = UsageQuery(
            owner=query.owner,
            channels=query.channels,
            user_id=query.user_id,
            api_key_id=query.api_key_id,
            since=start,
            until=start + dt.timedelta(days=1),
        )
        async with self._read_sessions() as session:
            rows = await usage_rows(session, todays)
            counted, limit = 0, 0
            if self._fair_use is not None:
                window = int(now // DAY_S) * DAY_S
                standing = await self._fair_use.standing(
                    await session.connection(), subject, window
                )
                counted, limit = standing.tokens_used, standing.limits.tokens_per_day
        return Today(
            day=day,
            turns_done=sum(r.turns_done for r in rows),
            turns_failed=sum(r.turns_failed for r in rows),
            turns_stopped=sum(r.turns_stopped for r in rows),
            prompt_tokens=sum(r.prompt_tokens for r in rows),
            cached_tokens=sum(r.cached_tokens for r in rows),
            completion_tokens=sum(r.completion_tokens for r in rows),
            counted_tokens=counted,
            tokens_per_day=limit,
        )

    async def today_by_user(self, *, owner: str, channel: str) -> tuple[dt.date, list[UsageRow]]:
        """Today (UTC) and every user's usage of one channel instance today, for an admin."""
        day, start = utc_day(self._clock())
        rows = await self.rows(
            UsageQuery(
                owner=owner,
                channels=(channel,),
                since=start,
                until=start + dt.timedelta(days=1),
            ),
            by_user=True,
        )
        return day, rows
