"""Our own HTTP API: ``POST /v1/messages``, turn status, and the reply as Server-Sent Events.

Handlers only authenticate, parse, hand the message to the turn service and
answer; the reply is generated after the answer. Every refusal is a JSON body
with ``error`` and ``reason``; nothing is stored for a refused request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncSession

from bot.apikeys import Principal
from bot.channels.api import branches, conversations, history, usage
from bot.channels.api.history import turn_document
from bot.channels.api.kind import API
from bot.channels.api.streaming import reserve_stream, stream_turn, wants_event_stream
from bot.channels.base import InboundMessage, SilentChannel
from bot.channels.ids import ID_MAX
from bot.channels.ingress import IngressClock, PostedMessage, rate_limited, read_posted
from bot.channels.kind import Wiring
from bot.http.errors import json_error
from bot.http.key_gate import Scope, requires
from bot.http.keys import READ_SESSIONS, SERVER, STREAM_READERS, TURN_FOLLOWERS, TURNS
from bot.http.ops import METRICS
from bot.http.readers import EventStreamReaders
from bot.storage.turn_reads import get_turn_for_owner, owned_turn_id
from bot.turns.branching import attempts_of
from bot.turns.followers import TurnFollowers
from bot.turns.idempotency import api_event_id


class ApiMessage(PostedMessage):
    """``POST /v1/messages``: a message, and the persona a new conversation starts with."""

    persona: str | None = Field(default=None, max_length=ID_MAX)
    """Starts a new conversation with this persona (GET /v1/personas lists them)."""


@requires(Scope.CHAT)
async def post_message(request: web.Request, principal: Principal) -> web.StreamResponse:
    clock = IngressClock(request)
    message = await read_posted(request, ApiMessage, request.app[SERVER])
    if isinstance(message, web.Response):
        return message
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

    # A streamed answer needs a stream slot: over the key's cap, nothing is stored.
    slot = reserve_stream(request, principal) if wants_event_stream(request) else None
    if isinstance(slot, web.Response):
        return slot
    try:
        accepted = await turns.accept(
            InboundMessage(
                channel=API.name,
                event_id=api_event_id(principal.owner, message.conversation_id, message.message_id),
                owner=principal.owner,
                conversation_key=message.conversation_id,
                text=message.text,
                user_id=message.user_id,
                layer_ms=clock.first_layers(),
                received_at=clock.received_at,
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
        return rate_limited(accepted.rate_limited)
    if accepted.id_conflict is not None:
        # The id names another message: answering with its turn would answer another question.
        if slot is not None:
            slot.release()
        return json_error(409, "conflict", accepted.id_conflict, turn_id=accepted.turn_id)
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
        return await stream_turn(request, accepted.turn_id, 0, slot)
    return web.json_response(
        {
            "turn_id": accepted.turn_id,
            "conversation_id": message.conversation_id,
            "stream_url": f"/v1/turns/{accepted.turn_id}/events",
            "duplicate": accepted.duplicate,
        },
        status=202,
    )


@requires(Scope.CHAT)
async def list_personas(request: web.Request, principal: Principal) -> web.Response:
    """The personas a new conversation can start with; null is the default system prompt."""
    personas = request.app[TURNS].personas
    return web.json_response(
        {
            "personas": [
                {"name": preset.name, "description": preset.description}
                for preset in (personas.presets if personas else [])
            ]
        }
    )


Found = TypeVar("Found")


async def _owned(
    request: web.Request,
    principal: Principal,
    read: Callable[[AsyncSession, str, str], Awaitable[Found | None]],
) -> Found | web.Response:
    """What ``read`` finds of the turn in the path for the caller: 404 when it is not
    theirs (or not there)."""
    turn_id = request.match_info["turn_id"]
    async with request.app[READ_SESSIONS]() as session:
        found = await read(session, turn_id, principal.owner)
    if found is None:
        return json_error(404, "not_found", f"no turn {turn_id}")
    return found


@requires(Scope.CHAT)
async def get_turn(request: web.Request, principal: Principal) -> web.Response:
    found = await _owned(request, principal, get_turn_for_owner)
    if isinstance(found, web.Response):
        return found
    turn, key = found
    async with request.app[READ_SESSIONS]() as session:
        attempts = await attempts_of(session, turn)
    return web.json_response(turn_document(turn, key, attempts=attempts))


def _owned_id(
    request: web.Request,
) -> Callable[[AsyncSession, str, str], Awaitable[str | None]]:
    """Reads whether a turn is the owner's: from memory for a turn this process accepted
    (no database read on the way to its first token), else its id from the database."""
    streams = request.app[TURNS].streams

    async def read(session: AsyncSession, turn_id: str, owner: str) -> str | None:
        known = streams.owner_of(turn_id)
        if known is None:
            return await owned_turn_id(session, turn_id, owner)
        return turn_id if known == owner else None

    return read


@requires(Scope.CHAT)
async def cancel_turn(request: web.Request, principal: Principal) -> web.Response:
    # The id is all a cancel or a stream needs: the row is not loaded.
    turn_id = await _owned(request, principal, _owned_id(request))
    if isinstance(turn_id, web.Response):
        return turn_id
    cancelled = await request.app[TURNS].cancel_turn(turn_id)
    return web.json_response({"turn_id": turn_id, "cancelled": cancelled})


def _resume_offset(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or "0"
    return int(raw) if raw.isdigit() else 0


@requires(Scope.CHAT)
async def turn_events(request: web.Request, principal: Principal) -> web.StreamResponse:
    turn_id = await _owned(request, principal, _owned_id(request))
    if isinstance(turn_id, web.Response):
        return turn_id
    slot = reserve_stream(request, principal)
    if isinstance(slot, web.Response):
        return slot
    return await stream_turn(request, turn_id, _resume_offset(request), slot)


def setup(app: web.Application, wiring: Wiring) -> None:
    wiring.turns.register_channel(SilentChannel(API.name))
    readers = EventStreamReaders(wiring.server.max_streams_per_key)
    followers = TurnFollowers(app[READ_SESSIONS], wiring.turns.streams)
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
    history.setup(app)
    conversations.setup(app)
    usage.setup(app)
    branches.setup(app)
