"""A turn's reply as it is generated: deltas, then one final outcome.

The events come from ``bot.turns.followers`` (the in-process stream when this
process runs the turn, else the turn's row, one poller per turn); here they
become what the OpenAI wire formats need.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from bot.channels.openai.errors import turn_failure
from bot.errors import USER_MESSAGES, ErrorClass
from bot.storage.models import Turn, TurnStatus
from bot.turns.followers import TurnFollowers


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Outcome:
    """How a turn ended: its reply and usage, or an error class."""

    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    error_class: ErrorClass | None = None
    error_message: str = ""

    @property
    def failed(self) -> bool:
        return self.error_class is not None


def _usage_int(usage: dict[str, object], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) else 0


def outcome_of_row(turn: Turn) -> Outcome:
    error = None
    if turn.status != TurnStatus.DONE:
        error = ErrorClass(turn.error_class or ErrorClass.INTERNAL.value)
    return Outcome(
        text=turn.reply_text or "",
        prompt_tokens=turn.prompt_tokens or 0,
        cached_tokens=turn.cached_tokens or 0,
        completion_tokens=turn.completion_tokens or 0,
        finish_reason=turn.finish_reason,
        error_class=error,
        error_message=USER_MESSAGES[error] if error else "",
    )


async def follow(followers: TurnFollowers, turn_id: str) -> AsyncIterator[Delta | Outcome]:
    """Deltas of the reply, then its ``Outcome`` (always last)."""
    text = ""
    async for event in followers.follow(turn_id):
        if event.kind == "delta":
            text += event.data["text"]
            yield Delta(event.data["text"])
        elif event.kind == "done":
            usage = event.data.get("usage") or {}
            yield Outcome(
                text=event.data.get("text", text),
                prompt_tokens=_usage_int(usage, "prompt_tokens"),
                cached_tokens=_usage_int(usage, "cached_tokens"),
                completion_tokens=_usage_int(usage, "completion_tokens"),
                finish_reason=event.data.get("finish_reason"),
            )
            return
        else:
            error = ErrorClass(event.data.get("error_class", ErrorClass.INTERNAL.value))
            yield Outcome(text, 0, 0, 0, None, error, event.data.get("message", ""))
            return
    # The turn is gone (deleted) or its row could not be read.
    yield Outcome(text, 0, 0, 0, None, ErrorClass.INTERNAL, USER_MESSAGES[ErrorClass.INTERNAL])


async def settled(followers: TurnFollowers, turn_id: str) -> Outcome | web.Response:
    """The turn's outcome once it has ended; a failed turn's is the error answer to send."""
    async for event in follow(followers, turn_id):
        if not isinstance(event, Outcome):
            continue
        if event.failed:
            assert event.error_class is not None
            status, error = turn_failure(event.error_class, event.error_message)
            return web.json_response(error, status=status)
        return event
    raise AssertionError("a turn's events always end with its outcome")
