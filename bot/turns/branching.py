"""Regenerate and edit: new turns that fork off the conversation's history tree.

The history is a tree of entries (``bot.storage.models.Message``). A
*regeneration* answers the same user entry again: its prompt is, id for id,
the prompt of the turn it replaces, so the engine serves it from the prefix
cache up to the last partial block, and the earlier reply stays stored as a
sibling. An *edit* replaces the last user message: the new text becomes a
sibling of the old user entry, after the same parent, so the branch shares
the whole prefix before the edited message. Either way the finished turn's
entries become the conversation's head (the active branch); ``activate``
makes an earlier branch active again.

Only the active branch's latest turn can be regenerated or edited, and only
once it has ended: forking in the middle would leave later turns answering a
history that is no longer theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bot.storage.history import path_entries
from bot.storage.models import FORK_AT_START, Conversation, Message, Turn, TurnStatus
from bot.storage.text import storable
from bot.storage.tokens import unpack_token_ids


class ForkRefused(Exception):
    """The turn cannot be regenerated or edited; ``reason`` says why (shown to the user)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Edit:
    """What replaces the user message of the turn being edited."""

    text: str
    reply_to: Mapping[str, Any] | None = None
    """Where the new reply goes (a chat platform: the edited message); None: the old turn's."""


async def _entry(session: AsyncSession, conversation_id: str, **where: Any) -> Message | None:
    query = select(Message).where(Message.conversation_id == conversation_id)
    for name, value in where.items():
        query = query.where(getattr(Message, name) == value)
    return (await session.scalars(query.order_by(Message.seq.desc()).limit(1))).first()


async def head_turn_id(session: AsyncSession, conversation: Conversation) -> str | None:
    """The turn whose reply ends the active branch (None: empty, or it ends with a base)."""
    if conversation.head_seq is None:
        return None
    head = await _entry(session, conversation.id, seq=conversation.head_seq)
    return head.turn_id if head is not None and head.role == "assistant" else None


async def latest_turn(session: AsyncSession, conversation: Conversation) -> Turn | None:
    """The turn a regenerate or an edit applies to: the active branch's last one.

    That is the newest turn when it is still open or failed (it has no entries),
    else the turn whose reply is the head.
    """
    newest = (
        await session.scalars(
            select(Turn)
            .where(Turn.conversation_id == conversation.id, Turn.coalesced_into.is_(None))
            .order_by(Turn.seq.desc())
            .limit(1)
        )
    ).first()
    if newest is None or newest.status != TurnStatus.DONE:
        return newest
    head_id = await head_turn_id(session, conversation)
    return None if head_id is None else await session.get(Turn, head_id)


async def _fork_points(session: AsyncSession, turn: Turn) -> tuple[int | None, int | None]:
    """(the user entry ``turn`` answered, the entry before that message) in the tree.

    None for the user entry when the turn left none (it failed): a regeneration then
    runs its text again from where it would have forked, the entry before it.
    """
    reply = await _entry(session, turn.conversation_id, turn_id=turn.id, role="assistant")
    user_seq: int | None = None
    if reply is not None:
        user_seq = reply.parent_seq
    elif turn.parent_seq is not None and turn.parent_seq >= 0:
        forked_at = await _entry(session, turn.conversation_id, seq=turn.parent_seq)
        if forked_at is not None and forked_at.role == "user":
            user_seq = forked_at.seq  # a failed regeneration
    if user_seq is None:
        return None, turn.parent_seq
    user = await _entry(session, turn.conversation_id, seq=user_seq)
    parent = user.parent_seq if user is not None else None
    return user_seq, FORK_AT_START if parent is None else parent


async def fork_turn(
    session: AsyncSession,
    target: Turn,
    seq: int,
    *,
    edit: Edit | None = None,
    continues: bool = False,
) -> Turn:
    """The queued turn that regenerates (``edit`` None) or edits ``target`` (caller adds it);
    ``continues``: that carries on ``target``'s reply, cut at the length limit.

    A continuation is a new attempt at the same message, like a regeneration, whose reply
    starts with the cut one's, id for id (``bot.turns.resumption``): the cut reply stays a
    version beside it.

    Call it after taking the conversation's next turn number (``allocate_turn_seq``
    locks the conversation row), so two forks of one turn cannot both pass the checks.
    """
    action = "edited" if edit is not None else "continued" if continues else "regenerated"
    conversation = await session.get(Conversation, target.conversation_id)
    if conversation is None or conversation.closed_at is not None:
        raise ForkRefused(f"the conversation was closed: only an open one can be {action}")
    if target.coalesced_into is not None:
        answering = await session.get(Turn, target.coalesced_into)
        target = answering or target
    latest = await latest_turn(session, conversation)
    if latest is None or latest.id != target.id:
        raise ForkRefused(f"only the conversation's latest turn can be {action}")
    if target.status not in TurnStatus.FINAL:
        raise ForkRefused(f"the turn is still being answered: it can be {action} once it ends")
    cut = None
    if continues:
        cut = await _entry(session, target.conversation_id, turn_id=target.id, role="assistant")
        if target.finish_reason != "length" or cut is None:
            raise ForkRefused("only a reply cut at the length limit can be continued")
    user_seq, before_seq = await _fork_points(session, target)
    fork = Turn(
        conversation_id=target.conversation_id,
        seq=seq,
        channel=target.channel,
        reply_to=dict(target.reply_to),
        user_id=target.user_id,
        user_name=target.user_name,
        api_key_id=target.api_key_id,
        status=TurnStatus.QUEUED,
        # The client's parameters hold for its reply's other attempts too; a regeneration
        # is sampled (``bot.turns.sampling.resolve``), the runner sees it by its link.
        sampling=target.sampling,
    )
    if cut is not None:
        fork.continues_turn_id = target.id
        fork.reply_text = cut.text
        fork.reply_token_ids = cut.token_ids
        fork.continued_tokens = len(unpack_token_ids(cut.token_ids))
    if edit is None:
        fork.user_text = target.user_text
        fork.regenerates_turn_id = target.regenerates_turn_id or target.id
        fork.attempt = await attempts_of(session, target) + 1
        fork.parent_seq = user_seq if user_seq is not None else before_seq
        fork.edits_turn_id = target.edits_turn_id if user_seq is None else None
    else:
        # Storable before it is ever tokenized, like every user text (``TurnService.accept``).
        fork.user_text = storable(edit.text)
        fork.edits_turn_id = target.id
        fork.parent_seq = before_seq
        if edit.reply_to is not None:
            fork.reply_to = dict(edit.reply_to)
    return fork


async def attempts_of(session: AsyncSession, turn: Turn) -> int:
    """How many answers the message of ``turn`` has had: the first one and its regenerations."""
    root = turn.regenerates_turn_id or turn.id
    attempts = await session.scalar(
        select(func.max(Turn.attempt)).where(
            Turn.conversation_id == turn.conversation_id,
            (Turn.id == root) | (Turn.regenerates_turn_id == root),
        )
    )
    return int(attempts or 1)


async def activate(session: AsyncSession, turn: Turn) -> int | None:
    """Make the branch through ``turn``'s reply the active one; its new head, or None.

    The head becomes the newest entry below that reply (the branch as it was last
    left), so switching back and forth returns to where each branch ended.
    """
    reply = await _entry(session, turn.conversation_id, turn_id=turn.id, role="assistant")
    if reply is None:
        return None
    entries = (
        await session.execute(
            select(Message.seq, Message.parent_seq).where(
                Message.conversation_id == turn.conversation_id, Message.seq >= reply.seq
            )
        )
    ).all()
    below = {reply.seq}
    for seq, parent in sorted(entries):
        if parent in below:
            below.add(seq)
    head = max(below)
    await session.execute(
        update(Conversation).where(Conversation.id == turn.conversation_id).values(head_seq=head)
    )
    return head


@dataclass(frozen=True)
class TreeView:
    """Which turns the active branch shows, and each exchange's alternatives."""

    active: set[str]
    alternatives: dict[str, list[str]]
    """turn id -> the done turns answering the same point of the tree (regenerations
    and edits), oldest first; only for turns that have some."""


async def tree_view(
    session: AsyncSession, conversation: Conversation, turns: Sequence[Turn]
) -> TreeView:
    """The active branch among ``turns`` (a conversation's), and the alternatives of each."""
    entries = (
        await session.execute(
            select(Message.seq, Message.parent_seq, Message.role, Message.turn_id).where(
                Message.conversation_id == conversation.id
            )
        )
    ).all()
    by_seq = {seq: (parent, role, turn_id) for seq, parent, role, turn_id in entries}
    on_path: set[int] = set()
    if conversation.head_seq is not None:
        on_path = {
            e.seq
            for e in await path_entries(
                session, conversation.id, conversation.head_seq, through_bases=True
            )
        }
    reply_of: dict[str, int] = {}
    for seq, (_, role, turn_id) in by_seq.items():
        if role == "assistant" and turn_id is not None:
            reply_of[turn_id] = seq
    # An exchange's place in the tree: the entry before its user message.
    place: dict[str, int] = {}
    for turn_id, seq in reply_of.items():
        user_seq = by_seq[seq][0]
        user_parent = by_seq[user_seq][0] if user_seq in by_seq else None
        place[turn_id] = FORK_AT_START if user_parent is None else user_parent
    active: set[str] = set()
    for turn in turns:
        if turn.id in reply_of:
            shown = reply_of[turn.id] in on_path
        elif turn.coalesced_into is not None:
            shown = turn.coalesced_into not in reply_of or reply_of[turn.coalesced_into] in on_path
        else:
            # No reply stored (open or failed): shown unless it forked off another branch.
            shown = turn.parent_seq is None or turn.parent_seq < 0 or turn.parent_seq in on_path
        if shown:
            active.add(turn.id)
    groups: dict[int, list[str]] = {}
    for turn in turns:
        if turn.id in place:
            groups.setdefault(place[turn.id], []).append(turn.id)
    alternatives = {
        turn_id: group for group in groups.values() if len(group) > 1 for turn_id in group
    }
    return TreeView(active, alternatives)
