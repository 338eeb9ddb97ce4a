"""What every OpenAI-compatible endpoint does before the turn: body, model, stream slot, accept.

The same checks, in the same order, as the HTTP API's: the key (the gate, before
the handler), the body within ``server.max_body_bytes``, the text within
``server.max_text_chars``, a stream slot within ``server.max_streams_per_key``,
the fair-use limits when the turn is accepted. Only the shape of a refusal
differs: an OpenAI error object. The turn service gets one inbound message with
the history it carries; matching that history to a stored conversation and
recording the exchange are its (``bot.turns.carried``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from bot.apikeys import Principal
from bot.channels.base import InboundMessage
from bot.channels.ingress import IngressClock
from bot.channels.openai.errors import RequestRefused, bad_request, openai_error
from bot.channels.openai.kind import OPENAI
from bot.channels.openai.requests import Request, parse
from bot.engine.settings import EngineSettings
from bot.errors import ErrorClass
from bot.http.body import BodyError, parse_json_object, read_body
from bot.http.keys import ENGINE_SETTINGS, SERVER, STREAM_READERS, TURNS
from bot.http.readers import StreamSlot
from bot.turns.carried import CarriedHistory
from bot.turns.sampling import Sampling

log = structlog.get_logger(__name__)

CONFLICT_CODE = "conflict"


def served_model(engine: EngineSettings) -> str:
    """The model id clients name: ``engine.served_model_name``, else the model (folder name)."""
    if engine.served_model_name:
        return engine.served_model_name
    path = Path(engine.model)
    return path.name if path.is_absolute() or path.exists() else engine.model


def check_model(engine: EngineSettings, model: Any) -> None:
    served = served_model(engine)
    if model not in {served, engine.model}:
        raise RequestRefused(
            openai_error(
                404,
                f"The model {model!r} does not exist; this service serves {served!r}.",
                ErrorClass.MODEL_NOT_FOUND.value,
                param="model",
            )
        )


@dataclass(frozen=True)
class Admitted:
    """An authenticated request with its JSON body, and the time those took."""

    principal: Principal
    clock: IngressClock


async def admit(
    request: web.Request, principal: Principal, request_type: type[Request]
) -> tuple[Admitted, Request]:
    """Read the body as ``request_type`` and check the model it names; raises
    ``RequestRefused`` with the OpenAI answer."""
    clock = IngressClock(request)
    try:
        document = parse_json_object(await read_body(request, request.app[SERVER].max_body_bytes))
    except BodyError as exc:
        status = exc.response.status
        reason = exc.response.text or "unusable body"
        code = "too_large" if status == 413 else ErrorClass.BAD_REQUEST.value
        raise RequestRefused(openai_error(status, reason, code)) from None
    body = parse(request_type, document)
    check_model(request.app[ENGINE_SETTINGS], body.model)
    return Admitted(principal, clock), body


def check_text(request: web.Request, text: str) -> None:
    limit = request.app[SERVER].max_text_chars
    if len(text) > limit:
        raise bad_request(f"The new message has {len(text)} characters; the limit is {limit}.")


def reserve_stream(request: web.Request, principal: Principal) -> StreamSlot:
    """A slot among the key's open streams (``server.max_streams_per_key``), or a 429."""
    readers = request.app[STREAM_READERS]
    slot = readers.reserve(principal.key_id, request)
    if slot is None:
        raise RequestRefused(
            openai_error(
                429,
                f"This API key has {readers.open_for(principal.key_id)} streams open; the "
                f"limit is {readers.max_per_key} (server.max_streams_per_key).",
                ErrorClass.RATE_LIMITED.value,
                param="stream",
            )
        )
    return slot


@dataclass(frozen=True)
class StartedTurn:
    turn_id: str
    conversation_id: str
    continuation: str | None


async def start_turn(
    request: web.Request,
    admitted: Admitted,
    *,
    text: str,
    carried: CarriedHistory,
    sampling: Sampling,
    user_id: str | None,
) -> StartedTurn:
    """Hand the new user turn, with the history it came with, to the turn service."""
    principal = admitted.principal
    accepted = await request.app[TURNS].accept(
        InboundMessage(
            channel=OPENAI.name,
            # Every call is a new message: OpenAI requests carry no message id to dedupe on.
            event_id=uuid.uuid4().hex,
            owner=principal.owner,
            conversation_key="",  # found from the carried history
            text=text,
            user_id=user_id,
            layer_ms=admitted.clock.first_layers(),
            received_at=admitted.clock.received_at,
            api_key_id=principal.key_id,
            sampling=sampling,
            carried=carried,
        )
    )
    if accepted.rate_limited is not None:
        refusal = accepted.rate_limited
        raise RequestRefused(
            openai_error(
                429,
                refusal.user_message,
                ErrorClass.RATE_LIMITED.value,
                headers={"Retry-After": str(refusal.retry_after_s)},
            )
        )
    if accepted.history_conflict is not None:
        raise RequestRefused(
            openai_error(
                409, accepted.history_conflict, CONFLICT_CODE, param="previous_response_id"
            )
        )
    log.info(
        "openai_turn",
        api=carried.record.api,
        continuation=accepted.continuation,
        turn_id=accepted.turn_id,
        conversation_id=accepted.conversation_id,
    )
    return StartedTurn(accepted.turn_id, accepted.conversation_id, accepted.continuation)
