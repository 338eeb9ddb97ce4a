"""Which stored conversation an OpenAI request continues, and how a new one starts.

A request that re-sends a conversation as text continues the stored
conversation whose last turn is exactly its last exchange (same user text, same
reply, same exchanges before it): the new turn then extends that
conversation's stored token ids, so only the new user message is prefilled.
Anything else starts a new conversation. When the request carries earlier
exchanges this service has not stored (another client's history, an edited or
regenerated message), they are written into the new conversation first,
rendered once with the model's chat template, as any server that re-tokenizes
text would: the conversation is token-exact from then on.

Only the *latest* turn of a conversation can be continued: a request that
branches from an earlier turn starts a new conversation (with the history it
sent), it never rewrites a stored one.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.channels.openai.messages import Exchange, context_hash, extend_hash, same_text
from bot.storage import queries
from bot.storage.models import Conversation, Message, OpenAIExchange, Turn, TurnStatus
from bot.storage.tokens import pack_token_ids
from bot.turns.chat_format import ChatFormat

CANDIDATES_CHECKED = 8
"""Turns with the same context hash looked at per request (retries of one request)."""
CONVERSATION_KEY_PREFIX = "oai-"


class Continuation(enum.StrEnum):
    EXTENDED = "extended"
    """The request's history is a stored conversation's: the new turn extends its token ids."""
    NEW = "new"
    """No earlier exchange: a new conversation."""
    REBUILT = "rebuilt"
    """Earlier exchanges that are not stored here: a new conversation, rendered from the text."""


@dataclass(frozen=True)
class Thread:
    conversation_key: str
    continuation: Continuation
    context_hash: str
    """Hash of the exchanges before the new turn: stored with it, found by the next request."""


def new_conversation_key() -> str:
    return f"{CONVERSATION_KEY_PREFIX}{uuid.uuid4().hex}"


async def is_latest_turn(session: AsyncSession, turn: Turn) -> bool:
    later = await session.scalar(
        select(func.count())
        .select_from(Turn)
        .where(Turn.conversation_id == turn.conversation_id, Turn.seq > turn.seq)
    )
    return not later


async def find_extended(
    session: AsyncSession, owner: str, exchanges: Sequence[Exchange]
) -> Conversation | None:
    """The owner's open conversation whose latest turn is the last of ``exchanges``."""
    if not exchanges:
        return None
    last = exchanges[-1]
    rows = await session.execute(
        select(Turn, Conversation)
        .join(OpenAIExchange, OpenAIExchange.turn_id == Turn.id)
        .join(Conversation, Conversation.id == Turn.conversation_id)
        .where(
            OpenAIExchange.owner == owner,
            OpenAIExchange.context_hash == context_hash(exchanges[:-1]),
            Turn.status == TurnStatus.DONE,
            Conversation.owner == owner,
            Conversation.closed_at.is_(None),
        )
        .order_by(OpenAIExchange.created_at.desc())
        .limit(CANDIDATES_CHECKED)
    )
    for turn, conversation in rows:
        if (
            same_text(turn.user_text, last.user)
            and same_text(turn.reply_text or "", last.assistant)
            and await is_latest_turn(session, turn)
        ):
            return conversation
    return None


async def resolve(
    session: AsyncSession,
    *,
    owner: str,
    channel: str,
    exchanges: Sequence[Exchange],
    chat_format: ChatFormat,
) -> Thread:
    """The conversation a request's new turn goes to; seeds a new one with unknown history."""
    hashed = context_hash(exchanges)
    found = await find_extended(session, owner, exchanges)
    if found is not None:
        return Thread(found.external_key, Continuation.EXTENDED, hashed)
    key = new_conversation_key()
    if not exchanges:
        return Thread(key, Continuation.NEW, hashed)
    conversation = await queries.open_conversation(
        session, owner=owner, channel=channel, external_key=key
    )
    entries = history_entries(conversation.id, exchanges, chat_format)
    session.add_all(entries)
    conversation.head_seq = entries[-1].seq
    return Thread(key, Continuation.REBUILT, hashed)


async def forget(session: AsyncSession, owner: str, channel: str, conversation_key: str) -> None:
    """Delete a conversation, its history with it (one rebuilt for a request that was refused)."""
    await session.execute(
        delete(Conversation).where(
            Conversation.owner == owner,
            Conversation.channel == channel,
            Conversation.external_key == conversation_key,
        )
    )


def history_entries(
    conversation_id: str, exchanges: Sequence[Exchange], chat_format: ChatFormat
) -> list[Message]:
    """Token-exact history entries for exchanges known only as text.

    Shaped exactly like the entries the runner writes (a user entry that closes
    the previous reply and opens the next, then the reply's ids), so the runner
    and compaction treat the conversation like any other from here on.
    """
    entries: list[Message] = []
    previous_reply: list[int] | None = None
    for exchange in exchanges:
        user = (
            chat_format.first_turn(exchange.user)
            if previous_reply is None
            else chat_format.next_turn(previous_reply, exchange.user)
        )
        reply = list(chat_format.tokenizer.encode(exchange.assistant, add_special_tokens=False))
        seq = len(entries)
        entries.append(
            Message(
                conversation_id=conversation_id,
                seq=seq,
                parent_seq=seq - 1 if seq else None,
                role="user",
                text=user.content,
                token_ids=pack_token_ids(user.token_ids),
            )
        )
        entries.append(
            Message(
                conversation_id=conversation_id,
                seq=seq + 1,
                parent_seq=seq,
                role="assistant",
                text=exchange.assistant,
                token_ids=pack_token_ids(reply),
            )
        )
        previous_reply = reply
    return entries


@dataclass(frozen=True)
class StoredResponse:
    """A turn reachable as a Responses API object (``store`` was not false)."""

    turn: Turn
    exchange: OpenAIExchange
    conversation: Conversation


async def find_response(session: AsyncSession, owner: str, turn_id: str) -> StoredResponse | None:
    row = (
        await session.execute(
            select(Turn, OpenAIExchange, Conversation)
            .join(OpenAIExchange, OpenAIExchange.turn_id == Turn.id)
            .join(Conversation, Conversation.id == Turn.conversation_id)
            .where(
                Turn.id == turn_id,
                OpenAIExchange.owner == owner,
                OpenAIExchange.stored.is_(True),
                Conversation.owner == owner,
            )
        )
    ).first()
    if row is None:
        return None
    turn, exchange, conversation = row
    return StoredResponse(turn, exchange, conversation)


def hash_after(stored: StoredResponse) -> str:
    """The context hash of the conversation once ``stored``'s turn is answered."""
    turn = stored.turn
    return extend_hash(
        stored.exchange.context_hash, Exchange(turn.user_text, turn.reply_text or "")
    )
