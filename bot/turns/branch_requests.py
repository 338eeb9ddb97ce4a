"""Requests that answer a stored turn again, on a new branch: regenerate, continue, edit.

Each stores a new attempt at a turn (``bot.turns.branching.fork_turn``) in one
transaction, counted against fair use like a message, and hands it to its
conversation's worker; ``activate`` moves the conversation's head back to a branch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage import conversations, turn_reads
from bot.storage.models import InboundEvent, Turn, TurnStatus
from bot.turns import wakeups
from bot.turns.accepting import Accepted, Accepts
from bot.turns.branching import Edit, ForkRefused, fork_turn, latest_turn
from bot.turns.branching import activate as activate_branch
from bot.turns.inbound import InboundMessage
from bot.turns.limits import RateLimited, stored_turn_subjects

EDIT_LOOKBACK_TURNS = 500
"""How far back an edited chat message is looked for among a conversation's turns."""


class BranchRequests:
    """Regenerations, continuations, edits and branch switches of stored turns."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        accepts: Accepts,
    ) -> None:
        """``accepts``: a platform's edit of a message no turn was made of is a new
        message; the fair use, streams and workers a new attempt shares with them."""
        self._sessions = sessions
        self._accepts = accepts
        self._workers = accepts.workers

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
        duplicate = await self._accepts.find_duplicate(message)
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
        return await self._accepts.accept(message)

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
                if self._accepts.fair_use is not None:
                    subjects = await stored_turn_subjects(
                        session,
                        api_key_id=target.api_key_id,
                        channel=target.channel,
                        user_id=target.user_id,
                        conversation_id=target.conversation_id,
                    )
                    await self._accepts.fair_use.admit(await session.connection(), subjects)
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
                if not self._accepts.runs_turns:
                    await wakeups.announce(session, turn.conversation_id)
        except RateLimited as exc:
            return Accepted("", "", duplicate=False, rate_limited=exc.refusal)
        except IntegrityError:
            existing = await self._accepts.find_duplicate(event) if event is not None else None
            if existing is None:
                raise
            return existing
        self._workers.note_persisted(turn.id, (time.perf_counter() - started) * 1000)
        if self._accepts.claims.exclusive:
            self._accepts.streams.open(turn.id)
        self._workers.schedule(turn.conversation_id)
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
