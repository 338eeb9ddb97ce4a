"""Accepts inbound messages as turns and runs them: in order per conversation, concurrently across.

``TurnService`` is what channels and routes hold: it composes the parts, each a
module of its own, and passes their requests on.

* ``bot.turns.accepting``: a message stored as a turn, deduplicated, counted
  against fair use, in one write, and handed to its conversation's worker;
* ``bot.turns.conversation_workers``: one worker task per conversation runs
  its turns in order (a message waits for the reply to the one before it, while
  different conversations run side by side and vLLM batches them), and drains;
* ``bot.turns.branch_requests``: regenerate, continue, edit, switch branches;
* ``bot.turns.cancel_requests``: stop a turn here or on another worker;
* ``bot.turns.declines``: the apology for a message that gets no turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.errors import ErrorClass
from bot.storage import conversations
from bot.storage.kept import KeptConnection
from bot.turns.accepting import Accepted, Accepts
from bot.turns.branch_requests import BranchRequests
from bot.turns.branching import Edit
from bot.turns.cancel_requests import CancelRequests
from bot.turns.cancellation import Cancellations
from bot.turns.carried import CarriedHistories
from bot.turns.claiming import TurnClaims
from bot.turns.claims import LocalClaims
from bot.turns.conversation_workers import ConversationWorkers, TurnRunnerLike
from bot.turns.declines import Declines
from bot.turns.ending import TurnEndings
from bot.turns.inbound import InboundMessage
from bot.turns.limits import FairUse
from bot.turns.personas import Personas
from bot.turns.replies import Channel, ReplySink, TurnAddress
from bot.turns.streams import TurnStreams


class UnknownChannel(Exception):
    pass


class TurnService:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        streams: TurnStreams,
        *,
        turn_sessions: async_sessionmaker[AsyncSession] | None = None,
        claims: TurnClaims | None = None,
        runs_turns: bool = True,
        fair_use: FairUse | None = None,
        personas: Personas | None = None,
        kept_accepts: KeptConnection | None = None,
    ) -> None:
        """``sessions``: the requests' (accepts, edits, cancels); ``turn_sessions``: the
        turns' work, here their final writes (the same if not given; two pools on
        PostgreSQL, ``bot.storage.db.ServiceEngines``).

        ``claims``: turn leases (``bot.turns.claims.build_claims``; a single process's
        if not given). ``runs_turns``: False in an ingress-only process
        (``workers.run_turns``): it stores and announces the turns it accepts
        (``bot.turns.wakeups``) and the workers run them. ``kept_accepts``: SQLite, the
        connection the accepts' transactions run on, one after another
        (``bot.storage.kept``); the app closes it before its engines go.
        """
        self._sessions = sessions
        self.streams = streams
        self.endings = TurnEndings(turn_sessions or sessions, streams)
        """How every turn ends (row, stream, log line); the runner and the claims share it."""
        self._channels: dict[str, Channel] = {}
        self.claims = claims if claims is not None else LocalClaims(sessions)
        self.runs_turns = runs_turns
        self.fair_use = fair_use
        self.personas = personas
        """The configured personas; channels look names up here, the runner uses them."""
        self.kept_accepts = kept_accepts
        self.cancellations = Cancellations()
        """Stop requests for the turns running here; the runner shares it."""
        self.declines = Declines(self.open_reply)
        self.workers = ConversationWorkers(
            self.claims,
            self.cancellations,
            runs_turns=runs_turns,
            background=self.declines.pending,
        )
        self.accepts = Accepts(
            sessions,
            streams,
            self.workers,
            self.declines,
            claims=self.claims,
            runs_turns=runs_turns,
            fair_use=fair_use,
            kept_accepts=kept_accepts,
        )
        self.branches = BranchRequests(sessions, self.accepts)
        self.cancels = CancelRequests(sessions, self.workers, self.claims, self.endings)

    # -- wiring ------------------------------------------------------------------------

    def register_channel(self, channel: Channel) -> None:
        self._channels[channel.name] = channel

    def set_runner(self, runner: TurnRunnerLike, *, carried: CarriedHistories) -> None:
        """What needs the loaded chat format: the runner, and the matcher of the histories
        messages carry (``InboundMessage.carried``)."""
        self.workers.set_runner(runner)
        self.accepts.set_carried(carried)

    def open_reply(self, address: TurnAddress) -> ReplySink:
        name = address.channel.split(":", 1)[0]
        channel = self._channels.get(address.channel) or self._channels.get(name)
        if channel is None:
            raise UnknownChannel(f"no channel registered for {address.channel!r}")
        return channel.open_reply(address)

    # -- requests ----------------------------------------------------------------------

    async def accept(self, message: InboundMessage) -> Accepted:
        """Store the message as a turn (deduplicated) and schedule it (``Accepts.accept``)."""
        return await self.accepts.accept(message)

    async def rehearse(self, message: InboundMessage) -> None:
        """Run an accept's statements for ``message`` and store nothing (``bot.warm_up``)."""
        await self.accepts.rehearse(message)

    def decline(self, message: InboundMessage, error_class: ErrorClass, user_message: str) -> None:
        """Tell the sender why their message gets no reply; store nothing (``Declines``)."""
        self.declines.decline(message, error_class, user_message)

    async def regenerate(self, turn_id: str, *, owner: str | None = None) -> Accepted:
        return await self.branches.regenerate(turn_id, owner=owner)

    async def continue_reply(self, turn_id: str, *, owner: str | None = None) -> Accepted:
        return await self.branches.continue_reply(turn_id, owner=owner)

    async def edit(self, turn_id: str, edit: Edit, *, owner: str | None = None) -> Accepted:
        return await self.branches.edit(turn_id, edit, owner=owner)

    async def regenerate_latest(
        self, *, channel: str, owner: str, conversation_key: str
    ) -> Accepted | None:
        return await self.branches.regenerate_latest(
            channel=channel, owner=owner, conversation_key=conversation_key
        )

    async def accept_edit(self, message: InboundMessage, edited: Mapping[str, Any]) -> Accepted:
        return await self.branches.accept_edit(message, edited)

    async def activate(self, turn_id: str, *, owner: str) -> int | None:
        return await self.branches.activate(turn_id, owner=owner)

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
        return await self.cancels.cancel_active(
            channel=channel, owner=owner, conversation_key=conversation_key
        )

    async def cancel_turn(self, turn_id: str) -> bool:
        return await self.cancels.cancel_turn(turn_id)

    # -- lifecycle ---------------------------------------------------------------------

    async def recover(self) -> None:
        """At start-up: resume queued turns; fail turns a dead worker left half-done
        (``ConversationWorkers.recover``)."""
        self.claims.bind(self.open_reply, self.endings, self.workers.live_turn_ids)
        await self.workers.recover()

    def live_turn_ids(self) -> set[str]:
        return self.workers.live_turn_ids()

    @property
    def in_flight(self) -> int:
        return self.workers.in_flight

    async def wait_idle(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until every scheduled turn has finished (tests)."""
        await self.workers.wait_idle(timeout)

    async def shutdown(self, grace_s: float) -> int:
        """Stop scheduling; let running turns finish within ``grace_s``, cancel the rest;
        how many were cancelled (``ConversationWorkers.shutdown``)."""
        return await self.workers.shutdown(grace_s)
