"""Our own HTTP API: ``POST /v1/messages``, turn status, and the reply as Server-Sent Events.

Handlers only authenticate, parse, hand the message to the turn service and
answer; the reply is generated after the answer. Every refusal is a JSON body
with ``error`` and ``reason``; nothing is stored for a refused request.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select

from bot.apikeys import Principal
from bot.channels.api.auth import authenticate_chat
from bot.channels.api.channel import ApiChannel
from bot.channels.base import InboundMessage
from bot.config import Settings
from bot.errors import USER_MESSAGES, ErrorClass
from bot.http.body import BodyError, parse_json_object, read_body
from bot.http.errors import json_error
from bot.http.keys import (
    READ_SESSIONS,
    REQUEST_RECEIVED_AT,
    REQUEST_STARTED,
    SETTINGS,
    STREAM_READERS,
    TURN_FOLLOWERS,
    TURNS,
)
from bot.http.ops import METRICS
from bot.http.readers import EventStreamReaders, StreamSlot
from bot.http.sse import event_stream_response, pump_events
from bot.storage.models import Conversation, Turn
from bot.storage.queries import get_turn_for_owner
from bot.turns.ending import usage
from bot.turns.followers import TurnFollowers
from bot.turns.service import TurnService, api_event_id

API_CHANNEL = "api"
ID_MAX = 200


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    conversation_id: str = Field(min_length=1, max_length=ID_MAX)
    message_id: str = Field(min_length=1, max_length=ID_MAX)
    text: str = Field(min_length=1)
    user_id: str | None = Field(default=None, max_length=ID_MAX)
    persona: str | None = Field(default=None, max_length=ID_MAX)
    """Starts a new conversation with this persona (GET /v1/personas lists them)."""


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
    turns = request.app[TURNS]
    persona = None
    if message.persona is not None:
        preset = turns.personas.get(message.persona) if turns.personas else None
        if preset is None:
            # The name is the client's data: said back only as JSON, never rendered anywhere.
            return json_error(
                400, "bad_request", "persona: unknown persona (GET /v1/personas lists them)"
            )
        persona = preset.name
    # Ingress: everything before auth (routing, middleware) plus reading and parsing the body.
    ingress_ms = (auth_started - started) * 1000 + (time.perf_counter() - ingress_started) * 1000

    # A streamed answer needs a stream slot: over the key's cap, nothing is stored.
    slot = _reserve_stream(request, principal) if _wants_event_stream(request) else None
    if isinstance(slot, web.Response):
        return slot
    try:
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
                persona=persona,
            )
        )
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    if accepted.rate_limited is not None:
        if slot is not None:
            slot.release()
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
    if accepted.persona_conflict is not None:
        if slot is not None:
            slot.release()
        conflict = accepted.persona_conflict
        return json_error(
            409,
            "conflict",
            conflict.reason,
            conversation_persona=conflict.conversation_persona,
            requested_persona=conflict.requested,
        )
    if slot is not None:
        return await _stream_turn(request, accepted.turn_id, 0, slot)
    return web.json_response(
        {
            "turn_id": accepted.turn_id,
            "conversation_id": message.conversation_id,
            "stream_url": f"/v1/turns/{accepted.turn_id}/events",
            "duplicate": accepted.duplicate,
        },
        status=202,
    )


async def list_personas(request: web.Request) -> web.Response:
    """The personas a new conversation can start with; null is the default system prompt."""
    principal = await authenticate_chat(request)
    if isinstance(principal, web.Response):
        return principal
    personas = request.app[TURNS].personas
    return web.json_response(
        {
            "personas": [
                {"name": preset.name, "description": preset.description}
                for preset in (personas.presets if personas else [])
            ]
        }
    )


async def _owned_turn(request: web.Request) -> tuple[Turn, str, Principal] | web.Response:
    principal = await authenticate_chat(request)
    if isinstance(principal, web.Response):
        return principal
    turn_id = request.match_info["turn_id"]
    async with request.app[READ_SESSIONS]() as session:
        turn = await get_turn_for_owner(session, turn_id, principal.owner)
        if turn is None:
            return json_error(404, "not_found", f"no turn {turn_id}")
        external_key = await session.scalar(
            select(Conversation.external_key).where(Conversation.id == turn.conversation_id)
        )
    return turn, external_key or "", principal


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
        "usage": usage(turn.prompt_tokens, turn.cached_tokens, turn.completion_tokens),
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
    turn, key, _ = found
    return web.json_response(turn_document(turn, key))


async def cancel_turn(request: web.Request) -> web.Response:
    found = await _owned_turn(request)
    if isinstance(found, web.Response):
        return found
    turn, _, _ = found
    cancelled = await request.app[TURNS].cancel_turn(turn.id)
    return web.json_response({"turn_id": turn.id, "cancelled": cancelled})


def _resume_offset(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or "0"
    return int(raw) if raw.isdigit() else 0


async def turn_events(request: web.Request) -> web.StreamResponse:
    found = await _owned_turn(request)
    if isinstance(found, web.Response):
        return found
    turn, _, principal = found
    slot = _reserve_stream(request, principal)
    if isinstance(slot, web.Response):
        return slot
    return await _stream_turn(request, turn.id, _resume_offset(request), slot)


def _reserve_stream(request: web.Request, principal: Principal) -> StreamSlot | web.Response:
    readers = request.app[STREAM_READERS]
    slot = readers.reserve(principal.key_id, request)
    if slot is None:
        return json_error(
            429,
            "rate_limited",
            f"this API key has {readers.open_for(principal.key_id)} event streams open; "
            f"the limit is {readers.max_per_key}: close one (or read with GET /v1/turns/{{id}})",
            limit="server.max_streams_per_key",
        )
    return slot


async def _stream_turn(
    request: web.Request, turn_id: str, offset: int, slot: StreamSlot
) -> web.StreamResponse:
    """Stream the turn's events from ``offset``; the slot is released when the stream ends.

    A reader who left (before the headers, mid-stream or before the end) ends the
    handler quietly: the turn goes on and can be read again with Last-Event-ID.
    """
    response = event_stream_response()
    try:
        await response.prepare(request)
        finished = await pump_events(
            response,
            request.app[TURN_FOLLOWERS].follow(turn_id, offset),
            gone=slot.gone,
            keepalive_s=request.app[SETTINGS].server.sse_keepalive_s,
        )
        if finished:
            await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
    finally:
        slot.release()
    return response


def setup(
    app: web.Application, settings: Settings, turns: TurnService, http: aiohttp.ClientSession
) -> None:
    turns.register_channel(ApiChannel())
    readers = EventStreamReaders(settings.server.max_streams_per_key)
    followers = TurnFollowers(app[READ_SESSIONS], turns.streams)
    app[STREAM_READERS] = readers
    app[TURN_FOLLOWERS] = followers
    app[METRICS].track_streams(lambda: readers.count, lambda: followers.pollers)

    async def close_streams(app: web.Application) -> None:
        await followers.close()
        await readers.close()

    app.on_cleanup.append(close_streams)
    app.router.add_post("/v1/messages", post_message)
    app.router.add_get("/v1/personas", list_personas)
    app.router.add_get("/v1/turns/{turn_id}", get_turn)
    app.router.add_get("/v1/turns/{turn_id}/events", turn_events)
    app.router.add_post("/v1/turns/{turn_id}/cancel", cancel_turn)
    from bot.channels.api import history  # imports this module: keep the import here

    history.setup(app)
