"""A conversation's history: the path of entries from the root of its tree to one entry
(``path_entries``), and the token-exact prompt along it (``load_history``), read again
only where it is not known here (``bot.storage.known_paths``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, Select, String, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from bot.storage.conversations import ConversationHead, read_head
from bot.storage.known_paths import KnownPath, KnownPaths
from bot.storage.models import BASE_ROLE, Message
from bot.storage.tokens import unpack_token_ids


@dataclass(frozen=True)
class History:
    """The token-exact history up to one entry of the conversation's tree, ready to be extended."""

    prompt_ids: list[int]
    """Concatenation of the entries on the path: the next prompt starts with exactly these."""
    last_assistant_ids: list[int]
    next_seq: int
    """The conversation's next free ``messages.seq`` (insertion order, across every branch)."""
    ends_with_base: bool = False
    """The last entry is a compaction's base, which already closes its last reply."""
    head_seq: int | None = None
    """The path's last entry, which the next entry names as its parent; None: empty history."""
    last_role: str | None = None
    persona: str | None = None
    """The preset the conversation started with (``conversations.persona``); None: default."""
    owner: str | None = None
    """Whose conversation it is (``conversations.owner``): its tenant's cache salt."""


@dataclass(frozen=True)
class PathEntry:
    seq: int
    role: str
    text: str
    turn_id: str | None
    token_ids: bytes
    parent_seq: int | None = None


def _path_statement(*, through_bases: bool) -> Select[int, str, str, str | None, bytes, int | None]:
    # Built once, with bound parameters: building the recursive query anew for every
    # turn cost the event loop about a millisecond of SQLAlchemy's construction.
    conversation_id = bindparam("conversation_id", type_=String)
    step = select(Message.seq, Message.parent_seq, Message.role).where(
        Message.conversation_id == conversation_id,
        Message.seq == bindparam("head_seq", type_=Integer),
    )
    path = step.cte("path", recursive=True)
    parent = aliased(Message)

    def parents(column: Any) -> Any:
        return (
            select(column)
            .where(parent.conversation_id == conversation_id, parent.seq == path.c.parent_seq)
            .scalar_subquery()
        )

    # Each step looks its parent up by (conversation_id, seq), the unique index, in
    # correlated subqueries: written as a join, PostgreSQL's planner hashed the whole
    # conversation at every step (400 entries: 50 ms instead of 4).
    climb = select(path.c.parent_seq, parents(parent.parent_seq), parents(parent.role)).where(
        # Entries at or below ``above`` are not walked: their part of the path is known.
        path.c.parent_seq > bindparam("above", type_=Integer)
    )
    if not through_bases:
        climb = climb.where(path.c.role != BASE_ROLE)
    path = path.union_all(climb)
    return (
        select(
            Message.seq,
            Message.role,
            Message.text,
            Message.turn_id,
            Message.token_ids,
            Message.parent_seq,
        )
        .where(Message.conversation_id == conversation_id, Message.seq.in_(select(path.c.seq)))
        .order_by(Message.seq)
    )


_PATH = {through: _path_statement(through_bases=through) for through in (False, True)}


async def path_entries(
    session: AsyncSession,
    conversation_id: str,
    head_seq: int,
    *,
    through_bases: bool = False,
    above: int = -1,
) -> list[PathEntry]:
    """The entries from the root down to ``head_seq``, in order (one recursive query).

    Without ``through_bases`` the walk stops at the latest base on the path: what
    is above it was compacted away (stored, no longer prompted). With ``above``,
    it stops before the first entry whose seq is not greater (a known part).
    """
    rows = await session.execute(
        _PATH[through_bases],
        {"conversation_id": conversation_id, "head_seq": head_seq, "above": above},
    )
    return [PathEntry(*row) for row in rows]


async def load_history(
    session: AsyncSession,
    conversation_id: str,
    *,
    at: int | None = None,
    known: KnownPaths | None = None,
    head: ConversationHead | None = None,
) -> History:
    """The prompt up to entry ``at`` (default: the conversation's head; -1: empty).

    With ``known``, only the entries added since the conversation's last path read
    there are fetched, when the new path extends it (the same branch, no new base):
    with ``head`` too (the conversation's row, read where its turn was started) and
    the path known up to that head, nothing is read.
    """
    if head is None:
        head = await read_head(session, conversation_id)
    if at is None:
        at = head.head_seq
    if at is None or at < 0:
        return _history(None, head)
    return _history(await _read_path(session, conversation_id, at, known), head)


def known_history(
    conversation_id: str, head: ConversationHead, known: KnownPaths
) -> History | None:
    """``load_history`` at ``head`` when it would read nothing: no history yet, or the path
    to the head known here. None: it must be read (no session is opened before that)."""
    if head.head_seq is None or head.head_seq < 0:
        return _history(None, head)
    path = known.get(conversation_id)
    return _history(path, head) if path is not None and path.head_seq == head.head_seq else None


def _history(path: KnownPath | None, head: ConversationHead) -> History:
    if path is None:
        return History([], [], head.next_seq, persona=head.persona, owner=head.owner)
    return History(
        unpack_token_ids(path.prompt),
        unpack_token_ids(path.last_assistant),
        head.next_seq,
        ends_with_base=path.last_role == BASE_ROLE,
        head_seq=path.head_seq,
        last_role=path.last_role,
        persona=head.persona,
        owner=head.owner,
    )


async def _read_path(
    session: AsyncSession, conversation_id: str, at: int, known: KnownPaths | None
) -> KnownPath | None:
    earlier = known.get(conversation_id) if known is not None else None
    if earlier is not None and earlier.head_seq == at:
        return earlier
    # A parent's seq is always smaller than its children's: a path that extends the
    # known one has all its new entries above the known head.
    above = earlier.head_seq if earlier is not None and earlier.head_seq < at else -1
    entries = await path_entries(session, conversation_id, at, above=above)
    # Read to its start (the root, or a base where the prompt restarts), or only down to
    # the known head, or, forked below it (an edit, a regeneration), down to another branch.
    whole = not entries or entries[0].parent_seq is None or entries[0].role == BASE_ROLE
    extends = not whole and earlier is not None and entries[0].parent_seq == above
    if not whole and not extends and above >= 0:
        entries = await path_entries(session, conversation_id, at)
    if not entries:
        return None
    prompt = [earlier.prompt] if extends and earlier is not None else []
    last_assistant = earlier.last_assistant if extends and earlier is not None else b""
    for entry in entries:
        prompt.append(entry.token_ids)
        if entry.role == "assistant":
            last_assistant = entry.token_ids
    path = KnownPath(entries[-1].seq, b"".join(prompt), last_assistant, entries[-1].role)
    if known is not None:
        known.put(conversation_id, path)
    return path
