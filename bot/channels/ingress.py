"""What every channel's handler does alike when a message comes in.

A handler verifies the sender, parses the platform's payload, hands the message
to the turn service and answers; the pieces here are the parts of that which
do not depend on the platform: the ``ingress`` and ``auth`` timing of the turn
log line, the length check, the wording of a malformed body, and the 429 of a
message over a fair-use limit.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bot.channels.ids import ID_MAX
from bot.errors import ErrorClass
from bot.http.body import BodyError, parse_json_object, read_body
from bot.http.errors import json_error
from bot.http.keys import AUTH_MS, REQUEST_RECEIVED_AT, REQUEST_STARTED
from bot.http.storable import StorableId, StorableText
from bot.turns.inbound import InboundMessage
from bot.turns.limits import Refusal
from bot.turns.service import TurnService
from bot.turns.timing import LayerClock

if TYPE_CHECKING:
    from bot.http.settings import ServerSettings


class PostedText(BaseModel):
    """A body that carries a user's text and nothing else (the API's edit of a message)."""

    model_config = ConfigDict(extra="forbid")

    text: StorableText = Field(min_length=1)


class PostedMessage(PostedText):
    """The body of a message posted to the HTTP API (and, with a name, to a webhook)."""

    conversation_id: StorableId = Field(min_length=1, max_length=ID_MAX)
    message_id: StorableId = Field(min_length=1, max_length=ID_MAX)
    user_id: StorableId | None = Field(default=None, max_length=ID_MAX)


Posted = TypeVar("Posted", bound=PostedText)


class IngressClock(LayerClock):
    """The first two layers of a turn: ``auth`` is the time spent checking who sent the
    message (the key gate's, or ``measure("auth")``); ``ingress`` is all the rest before
    the message is handed over (routing, middleware, reading and parsing the body,
    finding the conversation)."""

    def __init__(self, request: web.Request) -> None:
        super().__init__({"auth": request.get(AUTH_MS, 0.0)})
        self._started: float = request.get(REQUEST_STARTED, time.perf_counter())
        self.received_at: float = request.get(REQUEST_RECEIVED_AT, time.time())

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self._started) * 1000

    def first_layers(self) -> dict[str, float]:
        auth_ms = self.layer_ms["auth"]
        return {"ingress": max(0.0, self.elapsed_ms() - auth_ms), "auth": auth_ms}


def too_long(text: str, limit: int) -> str | None:
    """Why a message over ``server.max_text_chars`` is refused, or None."""
    if len(text) <= limit:
        return None
    return f"text has {len(text)} characters; the limit is {limit}"


def declined_too_long(turns: TurnService, message: InboundMessage, limit: int) -> bool:
    """A chat message over the limit is never stored; its sender hears why, in the chat.

    True when ``message`` was declined so."""
    if len(message.text) <= limit:
        return False
    notice = (
        f"Sorry, your message is too long for me ({len(message.text):,} characters; "
        f"the limit is {limit:,}). Please shorten it."
    )
    turns.decline(message, ErrorClass.BAD_REQUEST, notice)
    return True


async def read_posted(
    request: web.Request, model: type[Posted], server: ServerSettings, body: bytes | None = None
) -> Posted | web.Response:
    """The message a client posted (``body``, if already read), or the refusal to answer
    (413 or 408 for the body, 400 for bad JSON, a wrong field or a text over the limit)."""
    try:
        raw = body if body is not None else await read_body(request, server.max_body_bytes)
        message = model.model_validate(parse_json_object(raw))
    except BodyError as exc:
        return exc.response
    except ValidationError as exc:  # every problem on one line: ``field: what is wrong; ...``
        problems = (f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        return json_error(400, "bad_request", "; ".join(problems))
    reason = too_long(message.text, server.max_text_chars)
    return message if reason is None else json_error(400, "bad_request", reason)


def rate_limited(refusal: Refusal) -> web.Response:
    """The answer to a message over a fair-use limit (nothing was stored)."""
    response = json_error(
        429,
        "rate_limited",
        refusal.user_message,
        limit=refusal.limit,
        retry_after_s=refusal.retry_after_s,
    )
    response.headers["Retry-After"] = str(refusal.retry_after_s)
    return response
