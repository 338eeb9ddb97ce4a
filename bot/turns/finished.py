"""What a turn's final write hands to the steps that run in its transaction.

The final write (``bot.turns.ending``) moves a turn to its final status with one
``UPDATE ... RETURNING``. The steps that share its transaction (fair use's charge,
a compaction's rows) need a few of the row's columns, not the row: returning those
as plain values instead of loading an ORM ``Turn`` (thirty columns, two of them JSON
to decode, an identity map to fill) was a third of every turn's final write, which
runs on the event loop (SQLite: in place), while other chats' turns wait for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class FinishedTurn:
    """A turn as its final write left it: the columns the final write and the steps in it
    read. Each field is named after its ``turns`` column, which the UPDATE returns."""

    conversation_id: str
    status: str
    channel: str
    user_id: str | None
    api_key_id: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None


InFinalWrite = Callable[[AsyncSession, FinishedTurn], Awaitable[None]]
"""A step of a turn's final transaction, run once its final status is written."""


def in_final_write(*steps: InFinalWrite | None) -> InFinalWrite | None:
    """Steps run in the turn's final transaction, in order (``TurnEndings.finish``)."""
    present = [step for step in steps if step is not None]
    if not present:
        return None

    async def run(session: AsyncSession, turn: FinishedTurn) -> None:
        for step in present:
            await step(session, turn)

    return run
