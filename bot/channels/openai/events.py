"""A turn's reply as it is generated: deltas, then one final outcome.

Follows the in-process stream when this process runs the turn, else the turn's
row (finished, or run by another worker that saves the reply so far there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.errors import USER_MESSAGES, ErrorClass
from bot.storage.models import Turn, TurnStatus
from bot.turns.streams import TurnStreams

STORED_TURN_POLL_S = 0.25
"""How often a turn this process does not run is re-read, at most."""
FIRST_POLL_S = 0.02
"""The first re-read: with several workers the turn usually starts here a moment after it
was accepted, and its stream opens then; the interval doubles up to ``STORED_TURN_POLL_S``."""


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Outcome:
    """How a turn ended: its reply and usage, or an error class."""

    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    error_class: ErrorClass | None = None
    error_message: str = ""

    @property
    def failed(self) -> bool:
        return self.error_class is not None


def _usage_int(usage: dict[str, object], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) else 0


def outcome_of_row(turn: Turn) -> Outcome:
    error = None
    if turn.status != TurnStatus.DONE:
        error = ErrorClass(turn.error_class or ErrorClass.INTERNAL.value)
    return Outcome(
        text=turn.reply_text or "",
        prompt_tokens=turn.prompt_tokens or 0,
        cached_tokens=turn.cached_tokens or 0,
        completion_tokens=turn.completion_tokens or 0,
        finish_reason=turn.finish_reason,
        error_class=error,
        error_message=USER_MESSAGES[error] if error else "",
    )


async def follow(
    streams: TurnStreams, sessions: async_sessionmaker[AsyncSession], turn_id: str
) -> AsyncIterator[Delta | Outcome]:
    """Deltas of the reply, then its ``Outcome`` (always last)."""
    offset = 0
    poll_s = FIRST_POLL_S
    while not streams.has(turn_id):
        async with sessions() as session:
            turn = await session.get(Turn, turn_id)
        if turn is None:
            yield Outcome("", 0, 0, 0, None, ErrorClass.INTERNAL, "the turn is gone")
            return
        so_far = turn.reply_text or ""
        if turn.status in TurnStatus.FINAL:
            if len(so_far) > offset:
                yield Delta(so_far[offset:])
            yield outcome_of_row(turn)
            return
        if len(so_far) > offset:
            yield Delta(so_far[offset:])
            offset = len(so_far)
        await asyncio.sleep(poll_s)
        poll_s = min(poll_s * 2, STORED_TURN_POLL_S)
    text = ""
    async for event in streams.subscribe(turn_id, offset):
        if event.kind == "delta":
            text += event.data["text"]
            yield Delta(event.data["text"])
        elif event.kind == "done":
            usage = event.data.get("usage") or {}
            yield Outcome(
                text=event.data.get("text", text),
                prompt_tokens=_usage_int(usage, "prompt_tokens"),
                cached_tokens=_usage_int(usage, "cached_tokens"),
                completion_tokens=_usage_int(usage, "completion_tokens"),
                finish_reason=event.data.get("finish_reason"),
            )
        else:
            error = ErrorClass(event.data.get("error_class", ErrorClass.INTERNAL.value))
            yield Outcome(text, 0, 0, 0, None, error, event.data.get("message", ""))
