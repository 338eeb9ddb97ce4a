"""Requests to stop a turn: the one running in a conversation (``/stop``), or one by id.

A turn running here is stopped at once (``bot.turns.cancellation``); one running
on another worker gets a cancel request its worker's poller carries out; a
queued one is failed as cancelled and never runs.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.errors import ErrorClass
from bot.storage import conversations
from bot.storage.models import Turn, TurnStatus
from bot.turns.claiming import TurnClaims
from bot.turns.conversation_workers import ConversationWorkers
from bot.turns.ending import TurnEnd, TurnEndings, apply_to_row


class CancelRequests:
    """Stops turns, here or (through the database) on another worker."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        workers: ConversationWorkers,
        claims: TurnClaims,
        endings: TurnEndings,
    ) -> None:
        self._sessions = sessions
        self._workers = workers
        self.claims = claims
        self.endings = endings

    async def cancel_active(self, *, channel: str, owner: str, conversation_key: str) -> bool:
        """Stop the reply being generated in this conversation, if any."""
        async with self._sessions() as session:
            conversation = await conversations.open_conversation(
                session, owner=owner, channel=channel, external_key=conversation_key
            )
            await session.commit()
            running_id = None
            if not self.claims.exclusive and self._workers.running_turn(conversation.id) is None:
                # Perhaps running on another worker: ask that one to stop it.
                running_id = await session.scalar(
                    select(Turn.id).where(
                        Turn.conversation_id == conversation.id,
                        Turn.status == TurnStatus.RUNNING,
                    )
                )
        active = self._workers.running_turn(conversation.id)
        if active is not None:
            return self._workers.cancel_here(active)
        return running_id is not None and await self.cancel_turn(running_id)

    async def cancel_turn(self, turn_id: str) -> bool:
        """Cancel one turn: a running one is stopped, a queued one never runs.

        A turn running on another worker gets a cancel request, which that
        worker's poller carries out within ``workers.poll_interval_s``.
        """
        if self._workers.cancel_here(turn_id):
            return True
        async with self._sessions() as session, session.begin():
            # Locked: the runner moves a turn from queued to running under the same lock.
            turn = await session.get(Turn, turn_id, with_for_update=True)
            if turn is None or turn.status in TurnStatus.FINAL:
                return False
            if turn.status == TurnStatus.RUNNING:
                if self._workers.cancel_here(turn_id):
                    return True  # started here while we waited for the lock
                if self.claims.exclusive:
                    return False  # not running here, and nowhere else: a crash left it
                turn.cancel_requested_at = dt.datetime.now(dt.UTC)
                return True
            end = TurnEnd.failed(ErrorClass.CANCELLED, "cancelled before it started")
            apply_to_row(turn, end)
        await self.endings.announce(turn, end)
        return True
