"""Our own HTTP API: ``POST /v1/messages``, turn status, and the reply as Server-Sent Events.

Handlers only authenticate, parse, hand the message to the turn service and
answer; the reply is generated after the answer. Every refusal is a JSON body
with ``error`` and ``reason``; nothing is stored for a refused request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select

from bot.channels.api.auth import authenticate_chat
from bot.channels.api.channel import ApiChannel
from bot.channels.base import InboundMessage
from bot.config import Settings
from bot.errors import USER_MESSAGES, ErrorClass
from bot.http.body import BodyError, parse_json_object, read_body
from bot.http.errors import json_error
from bot.http.keys import REQUEST_RECEIVED_AT, REQUEST_STARTED, SESSIONS, SETTINGS, TURNS
from bot.http.sse import format_event, open_event_stream
from bot.storage.models import Conversation, Turn, TurnStatus
from bot.storage.queries import get_turn_for_owner
from bot.turns.service import TurnService, api_event_id
from bot.turns.streams import StreamEvent, events_for_final

API_CHANNEL = "api"
# How often an SSE reader polls the database for a turn this process is not running.
STORED_TURN_POLL_S = 0.25
ID_MAX = 200


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    conversation_id: str = Field(min_length=1, max_length=ID_MAX)
    message_id: str = Field(min_length=1, max_length=ID_MAX)
    text: str = Field(min_length=1)
    user_id: str | None = Field(default=None, max_length=ID_MAX)


def _wants_event_stream(request: web.Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


async def post_message(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    started = request.get(REQUEST_STARTED, time.perf_counter())
    auth_started = time.perf_counter()
    principal = await authenticate_chat(request)
    if isinstance(principal, web.Response):
        return principal
    auth_ms = (time.perf_counter() - auth_started) * 1000

    ingress_started = time.perf_counter()
    try:
        document = parse_json_object(await read_body(request, settings.server.max_body_bytes))
        message = MessageIn.model_validate(document)
    except BodyError as exc:
        return exc.response
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'body'}: {item['msg']}"
            for item in exc.errors()
        )
        return json_error(400, "bad_request", problems)
    if len(message.text) > settings.server.max_text_chars:
        return json_error(
            400,
            "bad_request",
            f"text has {len(message.text)} characters; "
            f"the limit is {settings.server.max_text_chars}",
        )
    # Ingress: everything before auth (routing, middleware) plus reading and parsing the body.
    ingress_ms = (auth_started - started) * 1000 + (time.perf_counter() - ingress_started) * 1000

    turns = request.app[TURNS]
    accepted = await turns.accept(
        InboundMessage(
            channel=API_CHANNEL,
            event_id=api_event_id(principal.owner, message.conversation_id, message.message_id),
            owner=principal.owner,
            conversation_key=message.conversation_id,
            text=message.text,
            user_id=message.user_id,
            layer_ms={"ingress": ingress_ms, "auth": auth_ms},
            received_at=request.get(REQUEST_RECEIVED_AT, time.time()),
            api_key_id=principal.key_id,
        )
    )
    if accepted.rate_limited is not None:
        refusal = accepted.rate_limited
        response = json_error(
            429,
            "rate_limited",
            refusal.user_message,
            limit=refusal.limit,
            retry_after_s=refusal.retry_after_s,
        )
        response.headers["Retry-After"] = str(refusal.retry_after_s)
        return response
    if _wants_event_stream(request):
        return await _stream_turn(request, accepted.turn_id, 0)
    return web.json_response(
        {
            "turn_id": accepted.turn_id,
            "conversation_id": message.conversation_id,
            "stream_url": f"/v1/turns/{accepted.turn_id}/events",
            "duplicate": accepted.duplicate,
        },
        status=202,
    )


async def _owned_turn(request: web.Request) -> tuple[Turn, str] | web.Response:
    principal = await authenticate_chat(request)
    if isinstance(principal, web.Response):
        return principal
    turn_id = request.match_info["turn_id"]
    async with request.app[SESSIONS]() as session:
        turn = await get_turn_for_owner(session, turn_id, principal.owner)
        if turn is None:
            return json_error(404, "not_found", f"no turn {turn_id}")
        external_key = await session.scalar(
            select(Conversation.external_key).where(Conversation.id == turn.conversation_id)
        )
    return turn, external_key or ""


def public_error(error_class: str | None) -> str | None:
    """What a client is told of a failed turn: its class's message.

    Never the stored ``error_message``: that is for the log and the operator, and
    may name internal hosts or carry an exception's text.
    """
    if error_class is None:
        return None
    known = {member.value: member for member in ErrorClass}
    return USER_MESSAGES[known.get(error_class, ErrorClass.INTERNAL)]


def turn_document(turn: Turn, conversation_key: str) -> dict[str, Any]:
    layer_ms = dict(turn.layer_ms or {})
    return {
        "turn_id": turn.id,
        "conversation_id": conversation_key,
        "status": turn.status,
        "text": turn.user_text,
        "reply": turn.reply_text,
        "usage": {
            "prompt_tokens": turn.prompt_tokens,
            "cached_tokens": turn.cached_tokens,
            "completion_tokens": turn.completion_tokens,
        },
        "finish_reason": turn.finish_reason,
        "error_class": turn.error_class,
        "error": public_error(turn.error_class),
        "timings_ms": layer_ms,
        "coalesced_into": turn.coalesced_into,
        "compaction_id": turn.compaction_id,
        "created_at": turn.created_at.isoformat(),
    }


async def get_turn(request: web.Request) -> web.Response:
    found = await _owned_turn(request)
    if isinstance(found, web.Response):
        return found
    turn, key = found
    return web.json_response(turn_document(turn, key))


async def cancel_turn(request: web.Request) -> web.Response:
    found = await _owned_turn(request)
    if isinstance(found, web.Response):
        return found
    turn, _ = found
    cancelled = await request.app[TURNS].cancel_turn(turn.id)
    return web.json_response({"turn_id": turn.id, "cancelled": cancelled})


def _resume_offset(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or "0"
    return int(raw) if raw.isdigit() else 0


async def turn_events(request: web.Request) -> web.StreamResponse:
    found = await _owned_turn(request)
    if isinstance(found, web.Response):
        return found
    turn, _ = found
    return await _stream_turn(request, turn.id, _resume_offset(request))


def _final_event(turn: Turn) -> StreamEvent:
    if turn.status == TurnStatus.DONE:
        layer_ms = dict(turn.layer_ms or {})
        return StreamEvent(
            "done",
            "done",
            {
                "turn_id": turn.id,
                "text": turn.reply_text or "",
                "usage": {
                    "prompt_tokens": turn.prompt_tokens,
                    "cached_tokens": turn.cached_tokens,
                    "new_tokens": (turn.prompt_tokens or 0) - (turn.cached_tokens or 0),
                    "completion_tokens": turn.completion_tokens,
                },
                "finish_reason": turn.finish_reason,
                "timings_ms": layer_ms,
                # Answered by another turn (coalescing): its reply is on that turn's stream.
                **({"coalesced_into": turn.coalesced_into} if turn.coalesced_into else {}),
            },
        )
    error_class = ErrorClass(turn.error_class or ErrorClass.INTERNAL.value)
    return StreamEvent(
        "error",
        "error",
        {
            "turn_id": turn.id,
            "error_class": error_class.value,
            "message": USER_MESSAGES[error_class],
        },
    )


async def _stored_events(
    request: web.Request, turn_id: str, offset: int
) -> AsyncIterator[StreamEvent]:
    """Events of a turn this process is not streaming: finished, or run by another worker.

    A turn running on another worker is followed through its row, where that
    worker saves the reply so far every ``bot.turns.partials`` interval.
    """
    while True:
        async with request.app[SESSIONS]() as session:
            turn = await session.get(Turn, turn_id)
        if turn is None:
            return
        if turn.status in TurnStatus.FINAL:
            for event in events_for_final(turn.reply_text or "", _final_event(turn), offset):
                yield event
            return
        if request.app[TURNS].streams.has(turn_id):
            async for event in request.app[TURNS].streams.subscribe(turn_id, offset):
                yield event
            return
        so_far = turn.reply_text or ""
        if len(so_far) > offset:
            yield StreamEvent("delta", str(len(so_far)), {"text": so_far[offset:]})
            offset = len(so_far)
        await asyncio.sleep(STORED_TURN_POLL_S)


async def _stream_turn(request: web.Request, turn_id: str, offset: int) -> web.StreamResponse:
    streams = request.app[TURNS].streams
    events = (
        streams.subscribe(turn_id, offset)
        if streams.has(turn_id)
        else _stored_events(request, turn_id, offset)
    )
    response = await open_event_stream(request)
    try:
        async for event in events:
            await response.write(format_event(event.event_id, event.kind, event.data))
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        # The reader left; the turn goes on and can be read again with Last-Event-ID.
        return response
    await response.write_eof()
    return response


def setup(
    app: web.Application, settings: Settings, turns: TurnService, http: aiohttp.ClientSession
) -> None:
    turns.register_channel(ApiChannel())
    app.router.add_post("/v1/messages", post_message)
    app.router.add_get("/v1/turns/{turn_id}", get_turn)
    app.router.add_get("/v1/turns/{turn_id}/events", turn_events)
    app.router.add_post("/v1/turns/{turn_id}/cancel", cancel_turn)
    from bot.channels.api import history  # imports this module: keep the import here

    history.setup(app)
