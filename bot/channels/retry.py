"""``/retry``: answer the chat's last message again; the same words on every chat platform.

The new attempt forks the history tree at the last user entry
(``bot.turns.branching``): its prompt is, id for id, the earlier attempt's, and
the earlier reply stays stored.
"""

from __future__ import annotations

from bot.turns.branching import ForkRefused
from bot.turns.service import TurnService

NOTHING_TO_RETRY_TEXT = "Nothing to retry: send me a message first."
RETRY_REFUSED_TEXT = "I cannot retry now: {reason}."


async def run_retry(
    turns: TurnService, *, channel: str, owner: str, conversation_key: str
) -> str | None:
    """Start the new attempt; the notice to send, or None when the new reply says it all."""
    try:
        accepted = await turns.regenerate_latest(
            channel=channel, owner=owner, conversation_key=conversation_key
        )
    except ForkRefused as exc:
        return RETRY_REFUSED_TEXT.format(reason=exc.reason)
    if accepted is None:
        return NOTHING_TO_RETRY_TEXT
    if accepted.rate_limited is not None:
        return accepted.rate_limited.user_message
    return None
