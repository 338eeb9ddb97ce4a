"""SQLAlchemy 2.0 models. Alembic (``migrations/``) owns the schema; these must match it.

Every relationship is ``lazy="raise_on_sql"``: async code never lazy-loads by
accident, queries say what they load.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, QueryableAttribute, mapped_column, relationship
from sqlalchemy.sql.elements import ColumnElement

# Stable constraint names, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; they were written as UTC."""
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        dt.datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
    }


def table_of(model: type[Base]) -> Table:
    """``model``'s table, for Core statements that load no objects (the hot paths)."""
    return cast(Table, model.__table__)


def one_of(
    column: ColumnElement[Any] | QueryableAttribute[Any], values: Iterable[Any]
) -> ColumnElement[bool]:
    """``column IN (values)`` for values fixed when the statement is built, a bound
    parameter each.

    ``column.in_(values)`` binds the list as one "expanding" parameter, and SQLAlchemy
    renders it into the statement's SQL again at every execution: fair use's standing
    (every accept) took 87-103 us a call that way and 63-74 this way, where sqlite3
    runs the whole statement in 14.
    """
    return column.in_([literal(value) for value in sorted(values)])


def none_of(
    column: ColumnElement[Any] | QueryableAttribute[Any], values: Iterable[Any]
) -> ColumnElement[bool]:
    """``column NOT IN (values)``, as ``one_of``."""
    return column.not_in([literal(value) for value in sorted(values)])


class ApiKey(Base):
    """An API key. Only a SHA-256 of the secret part is stored; the prefix identifies it."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    owner: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[str] = mapped_column(String(200), default="chat")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[dt.datetime | None]
    expires_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]


class Conversation(Base):
    """A conversation. (owner, channel, external_key) names the *open* one; ``/new`` closes it."""

    __tablename__ = "conversations"
    __table_args__ = (
        Index(
            "uq_conversations_open_key",
            "owner",
            "channel",
            "external_key",
            unique=True,
            sqlite_where=text("closed_at IS NULL"),
            postgresql_where=text("closed_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(200))
    channel: Mapped[str] = mapped_column(String(200))
    external_key: Mapped[str] = mapped_column(String(400))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    closed_at: Mapped[dt.datetime | None]
    next_turn_seq: Mapped[int] = mapped_column(Integer, default=0)
    head_seq: Mapped[int | None] = mapped_column(Integer)
    """The active branch's last history entry (``messages.seq``); NULL while there is none.
    The next turn's prompt is the path from the root (or the latest base on it) to here."""
    persona: Mapped[str | None] = mapped_column(String(64))
    """The preset it was started with (``bot.turns.personas``); NULL: ``chat.system_prompt``.
    Set when the conversation is created, never changed: it opens the token-exact history."""

    messages: Mapped[list[Message]] = relationship(
        back_populates="conversation", lazy="raise_on_sql", order_by="Message.seq"
    )


BASE_ROLE = "base"
"""Role of the entry a compaction writes (``bot.turns.compaction``): the history restarts there."""


class Message(Base):
    """One entry of the token-exact history, a node of the conversation's history tree.

    ``token_ids`` holds exactly the ids this entry appended to its parent's
    prompt (packed, see ``bot.storage.tokens``): for a user message the
    closing of the previous assistant turn plus the rendered user turn and
    generation prompt (the first one also renders the system prompt), for an
    assistant message the ids the engine generated.

    ``parent_seq`` is the entry this one extends (NULL for the root), so the
    history is a tree: a regenerated reply is a second assistant child of the
    same user entry, an edited message a second user child of the same parent.
    A prompt is the concatenation of the entries on the path from the root (or
    from the latest ``base`` entry on it, see ``bot.turns.compaction``) down to
    one entry, in order; ``conversations.head_seq`` names the active branch's
    last entry. ``seq`` is the insertion order, unique per conversation, so a
    parent's seq is always smaller than its children's.

    An entry is never changed once written (an edit is a new branch) and goes
    only with its conversation, whose id is never used again: a path read once
    stays right (``bot.storage.known_paths``), as does the engine's cache of it.
    """

    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("conversation_id", "seq"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    # No index of its own: the unique (conversation_id, seq) one leads with it
    # (migration 0010 says why one more would hurt).
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    turn_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    parent_seq: Mapped[int | None] = mapped_column(Integer)

    conversation: Mapped[Conversation] = relationship(
        back_populates="messages", lazy="raise_on_sql"
    )


class InboundEvent(Base):
    """Every accepted inbound delivery; the unique (channel, event_id) makes redeliveries no-ops."""

    __tablename__ = "inbound_events"
    __table_args__ = (UniqueConstraint("channel", "event_id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    channel: Mapped[str] = mapped_column(String(200))
    event_id: Mapped[str] = mapped_column(String(400))
    conversation_id: Mapped[str | None] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    turn_id: Mapped[str | None] = mapped_column(String(32))
    received_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Turn(Base):
    """One user message and the reply to it: status, usage, timings, error."""

    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("conversation_id", "seq"),
        Index("ix_turns_status", "status"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    # No index of its own: the unique (conversation_id, seq) one leads with it
    # (migrations 0010 and 0011).
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    channel: Mapped[str] = mapped_column(String(200))
    reply_to: Mapped[dict[str, Any]] = mapped_column(default=dict)
    user_id: Mapped[str | None] = mapped_column(String(200))
    user_name: Mapped[str | None] = mapped_column(String(200))
    user_text: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    reply_text: Mapped[str | None] = mapped_column(Text)
    error_class: Mapped[str | None] = mapped_column(String(32))
    error_message: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None]
    cached_tokens: Mapped[int | None]
    completion_tokens: Mapped[int | None]
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    layer_ms: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    """The worker that runs (or is about to run) this turn; see ``bot.turns.leases``."""
    lease_expires_at: Mapped[dt.datetime | None]
    """Renewed while the turn runs; once past, another worker may take the turn over."""
    cancel_requested_at: Mapped[dt.datetime | None]
    """Set by a worker asked to stop a turn that runs on another; that one's poller stops it."""
    # Fair use is counted per API key; a coalesced turn points at the turn that answered
    # it; a turn that rebuilt the conversation's base names that compaction.
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    coalesced_into: Mapped[str | None] = mapped_column(String(32))
    compaction_id: Mapped[str | None] = mapped_column(String(32))
    parent_seq: Mapped[int | None] = mapped_column(Integer)
    """Where the turn's prompt forks off the history tree: NULL for an ordinary turn (the
    conversation's head when it runs); a user entry for a regeneration (the turn answers that
    entry again, id for id the same prompt); for an edit the entry the edited message followed,
    or ``FORK_AT_START`` (-1) when it was the first."""
    regenerates_turn_id: Mapped[str | None] = mapped_column(String(32))
    """A regeneration: the first attempt of the exchange this turn answers again."""
    edits_turn_id: Mapped[str | None] = mapped_column(String(32))
    """An edit: the turn whose user message this one replaces on a new branch."""
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default=text("1"))
    """1 for a turn's first answer, 2 for its first regeneration, ..."""
    sampling: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    """The sampling parameters its client chose (``bot.turns.sampling.Sampling``); NULL: the
    service's ``[generation]`` settings. Every run of the turn (in any worker, resumed,
    continued, regenerated) builds its engine request from it."""
    reply_token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    """While it runs with several workers: the token ids of ``reply_text``, saved with it
    (``bot.turns.partials``); a worker taking the turn over continues from them."""
    delivery: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    """Where the reply's platform message is (a channel's own state), saved with the reply,
    so a worker taking the turn over edits that message on (``bot.turns.resumption``)."""
    resumes: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    """How many times the reply was continued after its worker or engine stream died."""
    continues_turn_id: Mapped[str | None] = mapped_column(String(32))
    """A continuation: the turn whose reply, cut at the length limit, this one carries on."""
    continued_tokens: Mapped[int | None] = mapped_column(Integer)
    """A continuation: how many of ``reply_token_ids`` it carried over from that reply."""


FORK_AT_START = -1
"""``turns.parent_seq`` of an edit of a conversation's first message: an empty history."""


class TurnStatus:
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    FINAL = frozenset({DONE, FAILED})


class Compaction(Base):
    """A rebuild of a conversation's token-exact base (see ``bot.turns.compaction``).

    The base itself is the ``messages`` row at ``base_seq`` (role ``base``); the
    history is that row and every entry after it. Entries from ``kept_from_seq``
    on were re-rendered verbatim; older ones are only in ``summary``.
    """

    __tablename__ = "compactions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    turn_id: Mapped[str] = mapped_column(String(32))
    base_seq: Mapped[int] = mapped_column(Integer)
    kept_from_seq: Mapped[int | None] = mapped_column(Integer)
    summary: Mapped[str | None] = mapped_column(Text)
    dropped_exchanges: Mapped[int] = mapped_column(Integer)
    kept_exchanges: Mapped[int] = mapped_column(Integer)
    tokens_before: Mapped[int] = mapped_column(Integer)
    tokens_after: Mapped[int] = mapped_column(Integer)
    reasoning_dropped: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class PreparedBase(Base):
    """A conversation's next base, prepared ahead of its compaction (``bot.turns.preparation``).

    One row per conversation. ``claim`` names one preparation: a row that is not
    ``ready`` is a preparation in progress (or one that died half-way: ignored, and
    taken over once ``lease_until`` has passed). A ready row covers the path of the
    history tree from the base at ``after_base_seq`` (-1: no base yet) down to the
    entry ``head_seq`` (None: an empty history): its ``covered_tokens`` first prompt
    ids, whose SHA-256 is ``covered_digest``. A path that no longer passes through
    ``head_seq`` (an edit, a regeneration, another branch) or no longer starts with
    those ids has changed since: the row is stale.
    """

    __tablename__ = "prepared_bases"

    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    claim: Mapped[str] = mapped_column(String(32))
    ready: Mapped[bool] = mapped_column(default=False)
    lease_until: Mapped[dt.datetime]
    after_base_seq: Mapped[int] = mapped_column(Integer)
    head_seq: Mapped[int | None] = mapped_column(Integer)
    covered_tokens: Mapped[int] = mapped_column(Integer)
    covered_digest: Mapped[str] = mapped_column(String(64))
    token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    kept_from_seq: Mapped[int | None] = mapped_column(Integer)
    summary: Mapped[str | None] = mapped_column(Text)
    dropped_exchanges: Mapped[int] = mapped_column(Integer, default=0)
    kept_exchanges: Mapped[int] = mapped_column(Integer, default=0)
    reasoning_dropped: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class LimitOverride(Base):
    """Per-subject fair-use limits set by ``botctl limits set``; NULL = the configured default."""

    __tablename__ = "limit_overrides"

    subject: Mapped[str] = mapped_column(String(300), primary_key=True)
    messages_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class UsageCounter(Base):
    """One fixed-window counter per (subject, metric): the row is reset when its window ends.

    Kept in the database so limits survive restarts and hold across workers;
    updated with one atomic upsert, so concurrent workers never lose a count.
    """

    __tablename__ = "usage_counters"

    subject: Mapped[str] = mapped_column(String(300), primary_key=True)
    metric: Mapped[str] = mapped_column(String(32), primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[int] = mapped_column(BigInteger)


class OpenAIExchange(Base):
    """A turn that came in through the OpenAI-compatible API, and how to find it again.

    OpenAI clients re-send the whole conversation as text on every call. Each
    turn records a hash of the exchanges (user text, assistant reply) that came
    before its own user message (``context_hash``) and, while it is its
    conversation's latest turn, ``head_key``: that hash with its own message and
    end user. A later request whose messages are those exchanges plus this
    turn's user text and reply finds it by ``head_key`` and continues this turn's
    conversation token-exactly (``bot.turns.carried``). ``stored`` is the
    Responses API's ``store``: False hides the turn from ``GET
    /v1/responses/{id}`` and ``previous_response_id``.
    """

    __tablename__ = "openai_exchanges"
    __table_args__ = (Index("ix_openai_exchanges_owner_head_key", "owner", "head_key"),)

    turn_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    """The turn's id; deliberately no foreign key to ``turns``: on PostgreSQL the insert would
    take a key-share lock on the turn row just as the turn is being claimed, and the claim's
    ``FOR UPDATE SKIP LOCKED`` would skip it until the next poll. Rows go with their
    conversation (cascade below)."""
    conversation_id: Mapped[str] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    owner: Mapped[str] = mapped_column(String(200))
    context_hash: Mapped[str] = mapped_column(String(64))
    head_key: Mapped[str | None] = mapped_column(String(64))
    """Set while the turn is its conversation's latest (``bot.storage.exchanges``)."""
    api: Mapped[str] = mapped_column(String(32))
    """``chat.completions`` or ``responses``."""
    stored: Mapped[bool] = mapped_column(default=True)
    previous_response_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
