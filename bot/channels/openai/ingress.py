"""What every OpenAI-compatible endpoint does before the turn: key, body, model, admission.

The same checks, in the same order, as the HTTP API's: the API key (``Authorization:
Bearer``), the body within ``server.max_body_bytes``, the text within
``server.max_text_chars``, the fair-use limits when the turn is accepted. Only
the shape of a refusal differs: an OpenAI error object.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from bot.apikeys import Principal
from bot.channels.base import InboundMessage
from bot.channels.ingress import IngressClock
from bot.channels.openai.errors import RequestRefused, bad_request, openai_error
from bot.channels.openai.messages import Exchange
from bot.channels.openai.requests import Request, parse
from bot.channels.openai.threads import Continuation, Thread, forget, resolve
from bot.channels.registry import OPENAI
from bot.engine.settings import EngineSettings
from bot.errors import ErrorClass
from bot.http.body import BodyError, parse_json_object, read_body
from bot.http.keys import (
    CHAT_FORMAT,
    ENGINE_SETTINGS,
    SERVER,
    SESSIONS,
    TURNS,
)
from bot.storage.models import OpenAIExchange

log = structlog.get_logger(__name__)


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
    """Finding the conversation counts as ingress: it is part of taking the request in."""


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


async def find_thread(
    request: web.Request, admitted: Admitted, exchanges: Sequence[Exchange]
) -> Thread:
    """The conversation the request continues (or a new one seeded with its history)."""
    async with request.app[SESSIONS]() as session, session.begin():
        thread = await resolve(
            session,
            owner=admitted.principal.owner,
            channel=OPENAI.name,
            exchanges=exchanges,
            chat_format=request.app[CHAT_FORMAT].get(),
        )
    return thread


def check_text(request: web.Request, text: str) -> None:
    limit = request.app[SERVER].max_text_chars
    if len(text) > limit:
        raise bad_request(f"The new message has {len(text)} characters; the limit is {limit}.")


@dataclass(frozen=True)
class StartedTurn:
    turn_id: str
    conversation_id: str
    continuation: Continuation


async def start_turn(
    request: web.Request,
    admitted: Admitted,
    *,
    thread: Thread,
    text: str,
    api: str,
    stored: bool = True,
    previous_response_id: str | None = None,
    user_id: str | None = None,
) -> StartedTurn:
    """Hand the new user turn to the turn service and remember how to find it again."""
    principal = admitted.principal
    turns = request.app[TURNS]
    accepted = await turns.accept(
        InboundMessage(
            channel=OPENAI.name,
            # Every call is a new message: OpenAI requests carry no message id to dedupe on.
            event_id=uuid.uuid4().hex,
            owner=principal.owner,
            conversation_key=thread.conversation_key,
            text=text,
            user_id=user_id,
            layer_ms=admitted.clock.first_layers(),
            received_at=admitted.clock.received_at,
            api_key_id=principal.key_id,
        )
    )
    sessions = request.app[SESSIONS]
    if accepted.rate_limited is not None:
        refusal = accepted.rate_limited
        if thread.continuation == Continuation.REBUILT:
            # The history written for this request has no turn to answer: drop it.
            async with sessions() as session, session.begin():
                await forget(session, principal.owner, OPENAI.name, thread.conversation_key)
        raise RequestRefused(
            openai_error(
                429,
                refusal.user_message,
                ErrorClass.RATE_LIMITED.value,
                headers={"Retry-After": str(refusal.retry_after_s)},
            )
        )
    async with sessions() as session, session.begin():
        session.add(
            OpenAIExchange(
                turn_id=accepted.turn_id,
                conversation_id=accepted.conversation_id,
                owner=principal.owner,
                context_hash=thread.context_hash,
                api=api,
                stored=stored,
                previous_response_id=previous_response_id,
            )
        )
    log.info(
        "openai_turn",
        api=api,
        continuation=thread.continuation.value,
        turn_id=accepted.turn_id,
        conversation_id=accepted.conversation_id,
    )
    return StartedTurn(accepted.turn_id, accepted.conversation_id, thread.continuation)
