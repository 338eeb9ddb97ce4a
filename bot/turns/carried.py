"""A conversation that a request carries as text: which stored one it continues, or the
new one it starts.

OpenAI clients re-send the whole conversation on every call, as text. A request
continues the stored conversation whose *latest* turn answered exactly its last
exchange (same end user, same exchanges before it, same user text, same reply):
the new turn then extends that conversation's stored token ids, so only the new
message is prefilled. Anything else starts a conversation of its own: the
exchanges it carries are written into it first, rendered once with the chat
template (every piece of client text, the assistant's replies too, as literal
text: ``ChatFormat.reply_ids``), and it is token-exact from then on. A stored
conversation is never rewritten.

Finding and continuing are one step: the match is read before the accept's
transaction (``CarriedHistories.plan``, an index lookup of ``head_key``), and the
accept takes the matched conversation's next turn number only if its latest
turn is still the matched one (``bot.storage.exchanges.take_slot_if_latest``,
one statement, under the accept's lock). Two requests that re-send the same
history at once therefore never share a conversation: the first extends it,
the second finds it moved on and gets a conversation of its own, rebuilt from
its history. A turn named by the client (``previous_response_id``) that is no
longer the head is a conflict (``HistoryConflict``), not a new conversation.
"""

from __future__ import annotations

import enum
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from bot.storage import exchanges
from bot.storage.exchanges import ExchangeRecord, SeedEntry
from bot.storage.new_turns import TurnSlot
from bot.storage.text import storable
from bot.storage.tokens import pack_token_ids
from bot.turns.chat_format import ChatFormat

CONVERSATION_KEY_PREFIX = "oai-"


@dataclass(frozen=True)
class Exchange:
    """A user's side of the conversation, then the reply to it, as the client sent them."""

    user: str
    assistant: str

    def __post_init__(self) -> None:
        # Client text, made storable where it enters (``bot.storage.text``).
        object.__setattr__(self, "user", storable(self.user))
        object.__setattr__(self, "assistant", storable(self.assistant))


def same_text(a: str, b: str) -> bool:
    """Client round trips may trim a reply's surrounding whitespace; nothing else may change."""
    return a.strip() == b.strip()


def _digest(parts: Sequence[str]) -> str:
    piece = json.dumps(list(parts), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(piece.encode()).hexdigest()


EMPTY_CONTEXT = hashlib.sha256(b"").hexdigest()
"""The context of a conversation with no exchange yet."""


def extend_hash(previous: str, exchange: Exchange) -> str:
    """The context one exchange further.

    Chained, so a state reached through ``previous_response_id`` (where the client
    never sends the text) gets the same hash as the same exchanges sent in full.
    Whitespace is trimmed as ``same_text``.
    """
    piece = json.dumps(
        [exchange.user.strip(), exchange.assistant.strip()],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(f"{previous}{piece}".encode()).hexdigest()


def context_hash(exchanges: Sequence[Exchange]) -> str:
    """Names a conversation state: the exchanges so far, oldest first."""
    value = EMPTY_CONTEXT
    for exchange in exchanges:
        value = extend_hash(value, exchange)
    return value


def head_key(scope: str | None, context: str, user_text: str) -> str:
    """Names what a turn answers: its end user (``scope``: OpenAI's ``user``, so two end
    users of one key never share a conversation), the context and its own message."""
    return _digest([scope or "", context, user_text.strip()])


class Continuation(enum.StrEnum):
    EXTENDED = "extended"
    """The request's history is a stored conversation's: the new turn extends its ids."""
    NEW = "new"
    """No earlier exchange: a new conversation."""
    REBUILT = "rebuilt"
    """Earlier exchanges not stored here (or moved on): a new conversation seeded with them."""


@dataclass(frozen=True)
class ContinuedTurn:
    """The turn a client names to continue (``previous_response_id``)."""

    turn_id: str
    conversation_id: str
    seq: int
    context_after: str
    """The context once that turn is answered: the new turn's."""


@dataclass(frozen=True)
class CarriedHistory:
    """What a request carries beside its new message (``InboundMessage.carried``)."""

    record: ExchangeRecord
    exchanges: tuple[Exchange, ...] = ()
    """The answered exchanges it re-sends, oldest first (none with ``previous``)."""
    previous: ContinuedTurn | None = None
    """A turn the new one must continue: still its conversation's latest, else a conflict."""


class HistoryConflict(Exception):
    """The turn the request continues is no longer its conversation's latest (a 409)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _Target:
    turn_id: str
    conversation_id: str
    expected_next: int


@dataclass
class CarriedPlan:
    """A carried history's accept, worked out before its transaction."""

    context: str
    head_key: str
    targets: list[_Target] = field(default_factory=list)
    """Conversations it may continue, best first; the accept takes the first still open."""
    seed: list[SeedEntry] | None = None
    """Its exchanges as history entries (rendered ahead when no target was found)."""
    conflict_if_moved: bool = False
    placed: CarriedSlot | None = None
    """Where the accept put the turn (set in its transaction)."""


@dataclass(frozen=True)
class CarriedSlot:
    slot: TurnSlot
    continuation: Continuation
    continued_turn_id: str | None


def new_conversation_key() -> str:
    return f"{CONVERSATION_KEY_PREFIX}{uuid.uuid4().hex}"


class CarriedHistories:
    """Matches carried histories to stored conversations and seeds new ones (for the
    accept of ``bot.turns.accepting.Accepts``)."""

    def __init__(
        self, read_sessions: async_sessionmaker[AsyncSession], chat_format: ChatFormat
    ) -> None:
        self._read_sessions = read_sessions
        self._chat_format = chat_format

    async def plan(
        self, *, owner: str, scope: str | None, text: str, carried: CarriedHistory
    ) -> CarriedPlan:
        """The conversation the new message ``text`` may continue, read (and the history
        rendered, when there is none) before the accept's transaction."""
        previous = carried.previous
        if previous is not None:
            return CarriedPlan(
                context=previous.context_after,
                head_key=head_key(scope, previous.context_after, text),
                targets=[_Target(previous.turn_id, previous.conversation_id, previous.seq + 1)],
                conflict_if_moved=True,
            )
        history = carried.exchanges
        plan = CarriedPlan(context_hash(history), "")
        plan.head_key = head_key(scope, plan.context, text)
        if not history:
            return plan
        last = history[-1]
        async with self._read_sessions() as session:
            heads = await exchanges.open_heads(
                session, owner, head_key(scope, context_hash(history[:-1]), last.user)
            )
        plan.targets = [
            _Target(head.turn_id, head.conversation_id, head.next_turn_seq)
            for head in heads
            if same_text(head.reply_text, last.assistant)
        ]
        if not plan.targets:
            plan.seed = self.seed_entries(history)
        return plan

    async def take_slot(
        self,
        connection: AsyncConnection,
        *,
        owner: str,
        channel: str,
        carried: CarriedHistory,
        plan: CarriedPlan,
    ) -> CarriedSlot:
        """In the accept's transaction: the next turn number of the planned conversation if
        its latest turn is still the one matched, else of a new conversation seeded with
        the history. Raises ``HistoryConflict`` for a named turn that has moved on."""
        for target in plan.targets:
            slot = await exchanges.take_slot_if_latest(
                connection, target.conversation_id, target.expected_next
            )
            if slot is not None:
                return CarriedSlot(slot, Continuation.EXTENDED, target.turn_id)
        if plan.conflict_if_moved:
            raise HistoryConflict(
                "previous_response_id is no longer the latest response of its conversation "
                "(another request continued it, or it was regenerated): continue from the "
                "latest one, or send the whole conversation"
            )
        # Seeded here only when the conversation matched a moment ago moved on meanwhile.
        seed = plan.seed if plan.seed is not None else self.seed_entries(carried.exchanges)
        slot = await exchanges.open_seeded(
            connection,
            owner=owner,
            channel=channel,
            external_key=new_conversation_key(),
            entries=seed,
        )
        continuation = Continuation.REBUILT if seed else Continuation.NEW
        return CarriedSlot(slot, continuation, None)

    def seed_entries(self, history: Sequence[Exchange]) -> list[SeedEntry]:
        """Token-exact history entries for exchanges known only as text.

        Shaped exactly like the entries the runner writes (a user entry that closes
        the previous reply and opens the next, then the reply's ids), so the runner
        and compaction treat the conversation like any other from here on. Every
        text is literal: a reply that spells a control token stays text.
        """
        chat_format = self._chat_format
        entries: list[SeedEntry] = []
        previous_reply: list[int] | None = None
        for exchange in history:
            user = (
                chat_format.first_turn(exchange.user)
                if previous_reply is None
                else chat_format.next_turn(previous_reply, exchange.user)
            )
            reply = chat_format.reply_ids(exchange.assistant)
            entries.append(SeedEntry("user", user.content, pack_token_ids(user.token_ids)))
            entries.append(SeedEntry("assistant", exchange.assistant, pack_token_ids(reply)))
            previous_reply = reply
        return entries
