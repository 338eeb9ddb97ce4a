"""A delivery id names one message: a redelivery is the same turn, a reuse is refused.

Every channel dedupes on ``(channel, event_id)`` (``inbound_events``). Where the
platform chooses the id (Telegram's ``update_id``, Slack's ``event_id``) a second
delivery is always the same message. Where the client chooses it (the HTTP API's
and the generic webhook's ``message_id``) a client may also send a *new* message
under an old id: answering it with the old turn would answer another question
without a word. So the stored delivery is compared with the new one, and a
difference in text or conversation is reported (``reuse_conflict``); the routes
of client-chosen ids refuse it with 409 ``conflict``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sqlalchemy import String, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.storage.models import Conversation, InboundEvent, Turn
from bot.storage.text import storable
from bot.turns.inbound import InboundMessage


@dataclass(frozen=True)
class StoredDelivery:
    """What an earlier delivery with the same id was stored as."""

    turn_id: str | None
    conversation_id: str | None
    user_text: str | None
    """The text of the turn it made (None when it made none, or the turn is gone)."""
    conversation_key: str | None
    """The channel's key of the conversation it went to."""


_FIND = (
    select(
        InboundEvent.turn_id,
        InboundEvent.conversation_id,
        Turn.user_text,
        Conversation.external_key,
    )
    .outerjoin(Turn, Turn.id == InboundEvent.turn_id)
    .outerjoin(Conversation, Conversation.id == InboundEvent.conversation_id)
    .where(
        InboundEvent.channel == bindparam("channel", type_=String),
        InboundEvent.event_id == bindparam("event_id", type_=String),
    )
)
"""Built once: read on every redelivery."""


async def find_delivery(
    session: AsyncSession, channel: str, event_id: str
) -> StoredDelivery | None:
    row = (await session.execute(_FIND, {"channel": channel, "event_id": event_id})).one_or_none()
    if row is None:
        return None
    return StoredDelivery(*row)


def reuse_conflict(stored: StoredDelivery, message: InboundMessage) -> str | None:
    """Why ``message`` is not a redelivery of ``stored`` though it has its id; None if it is.

    The reason names neither text: it is the user's data, and the client has both.
    """
    if stored.conversation_key is not None and stored.conversation_key != message.conversation_key:
        return (
            "message_id was already used for a message of another conversation; "
            "a message_id names one message: send a new message with a new id"
        )
    # Compared as it was stored (``storable``): a NUL the store replaced is no difference.
    if stored.user_text is not None and stored.user_text != storable(message.text):
        return (
            "message_id was already used for a message with another text; a message_id "
            "names one message (the same id and text again returns its turn): send a new "
            "message with a new id"
        )
    return None


# inbound_events.event_id is VARCHAR(400); PostgreSQL counts characters.
EVENT_ID_MAX_CHARS = 400
EVENT_ID_HASH_PREFIX = "sha256:"


def api_event_id(owner: str, conversation_key: str, message_id: str) -> str:
    """Dedupe key of an HTTP API message: unique per owner, conversation and message id.

    The JSON array keeps short keys readable (and those already stored unchanged);
    a longer one (non-ASCII ids escape to six characters each) is replaced by its
    SHA-256, so any ids the API accepts fit the column.
    """
    key = json.dumps([owner, conversation_key, message_id], separators=(",", ":"))
    if len(key) <= EVENT_ID_MAX_CHARS:
        return key
    return EVENT_ID_HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()
