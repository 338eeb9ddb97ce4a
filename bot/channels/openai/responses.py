"""``POST /v1/responses`` and ``GET /v1/responses/{id}``: the Responses API, stateful form.

With ``previous_response_id`` the client sends only the new input; the turn
extends that response's conversation, whose token ids are stored here, so the
prompt is the previous prompt + reply, id for id, and only the new input is
prefilled. Without it, ``input`` may carry a whole conversation as messages and
is matched like a chat-completions request. ``store: false`` keeps the
response out of ``GET`` and ``previous_response_id`` (the turn itself is
stored and logged like every other: it is the conversation's history).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bot.apikeys import Principal
from bot.channels.openai import wire
from bot.channels.openai.errors import (
    RequestRefused,
    bad_request,
    chat_key,
    error_body,
    openai_error,
)
from bot.channels.openai.events import Delta, Outcome, follow, outcome_of_row, settled
from bot.channels.openai.ingress import (
    Admitted,
    StartedTurn,
    admit,
    check_text,
    find_thread,
    served_model,
    start_turn,
)
from bot.channels.openai.messages import Folded
from bot.channels.openai.requests import ResponsesRequest, fold_messages
from bot.channels.openai.threads import (
    Continuation,
    Thread,
    find_response,
    hash_after,
    is_latest_turn,
)
from bot.http.keys import ENGINE_SETTINGS, SESSIONS, TURN_FOLLOWERS, TURNS
from bot.http.sse import open_event_stream
from bot.storage.models import TurnStatus
from bot.storage.queries import as_utc

API_NAME = "responses"
RESPONSE_PREFIX = "resp_"
MESSAGE_PREFIX = "msg_"
NOT_FOUND_CODE = "not_found"
PREVIOUS_PARAM = "previous_response_id"

# A stored turn's status as a Response's.
_STATUS = {TurnStatus.QUEUED: "queued", TurnStatus.RUNNING: "in_progress"}


def response_id(turn_id: str) -> str:
    return f"{RESPONSE_PREFIX}{turn_id}"


def turn_id_of(response_id: str) -> str | None:
    return (
        response_id.removeprefix(RESPONSE_PREFIX)
        if response_id.startswith(RESPONSE_PREFIX)
        else None
    )


def input_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages (``instructions`` as a system one)."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    for index, item in enumerate(body.input):
        if item.get("type", "message") != "message":
            raise bad_request(f"input[{index}]: only message items are supported", "input")
        messages.append({"role": item.get("role"), "content": item.get("content")})
    return messages


def _usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


def message_item(turn_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": f"{MESSAGE_PREFIX}{turn_id}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content if text or status == "completed" else [],
    }


@dataclass(frozen=True)
class ResponseMeta:
    """What a Response object says about the request, whatever its state."""

    model: str
    created_at: float
    previous_response_id: str | None
    store: bool


def response_object(
    turn_id: str,
    meta: ResponseMeta,
    *,
    status: str,
    outcome: Outcome | None,
    text_so_far: str = "",
) -> dict[str, Any]:
    text = outcome.text if outcome is not None else text_so_far
    output = (
        []
        if status == "failed" or not (text or outcome)
        else [message_item(turn_id, text, "completed" if outcome else "in_progress")]
    )
    error = None
    if outcome is not None and outcome.failed:
        assert outcome.error_class is not None
        error = {"code": outcome.error_class.value, "message": outcome.error_message}
    return {
        "id": response_id(turn_id),
        "object": "response",
        "created_at": int(meta.created_at),
        "status": status,
        "model": meta.model,
        "output": output,
        "usage": _usage(outcome) if outcome is not None and not outcome.failed else None,
        "error": error,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "previous_response_id": meta.previous_response_id,
        "store": meta.store,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
    }


def final_status(outcome: Outcome) -> str:
    if outcome.failed:
        return "failed"
    return "incomplete" if outcome.finish_reason == "length" else "completed"


async def _previous_thread(
    request: web.Request, admitted: Admitted, previous: str, folded: Folded
) -> tuple[Thread, str]:
    """The thread that extends ``previous``, and the new turn's text."""
    if folded.exchanges:
        raise bad_request(
            "With previous_response_id, input holds only the new turn's messages.", "input"
        )
    turn_id = turn_id_of(previous)
    async with request.app[SESSIONS]() as session:
        stored = (
            await find_response(session, admitted.principal.owner, turn_id) if turn_id else None
        )
        if stored is None:
            raise RequestRefused(
                openai_error(
                    400,
                    f"Previous response with id {previous!r} not found.",
                    NOT_FOUND_CODE,
                    param=PREVIOUS_PARAM,
                )
            )
        if stored.turn.status != TurnStatus.DONE:
            raise bad_request(f"Previous response {previous!r} has not completed.", PREVIOUS_PARAM)
        if stored.conversation.closed_at is not None or not await is_latest_turn(
            session, stored.turn
        ):
            raise bad_request(
                f"Previous response {previous!r} is not the latest of its conversation; "
                "continuing from an earlier response is not supported.",
                PREVIOUS_PARAM,
            )
    thread = Thread(stored.conversation.external_key, Continuation.EXTENDED, hash_after(stored))
    return thread, folded.pending


@chat_key
async def create_response(request: web.Request, principal: Principal) -> web.StreamResponse:
    try:
        admitted, body = await admit(request, principal, ResponsesRequest)
        folded = fold_messages(input_messages(body), "input")
        if body.previous_response_id:
            thread, text = await _previous_thread(
                request, admitted, body.previous_response_id, folded
            )
        else:
            text = folded.pending
            thread = await find_thread(request, admitted, folded.exchanges)
        check_text(request, text)
        started = await start_turn(
            request,
            admitted,
            thread=thread,
            text=text,
            api=API_NAME,
            stored=body.store,
            previous_response_id=body.previous_response_id,
            user_id=body.user,
        )
    except RequestRefused as exc:
        return exc.response
    fields = ResponseMeta(
        served_model(request.app[ENGINE_SETTINGS]),
        time.time(),
        body.previous_response_id,
        body.store,
    )
    if body.stream:
        return await _stream(request, started, fields)
    outcome = await settled(request.app[TURN_FOLLOWERS], started.turn_id)
    if isinstance(outcome, web.Response):
        return outcome
    return web.json_response(
        response_object(started.turn_id, fields, status=final_status(outcome), outcome=outcome)
    )


class _EventWriter:
    """Writes Responses API events with their running ``sequence_number``."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._sequence = 0

    async def send(self, event_type: str, **fields: Any) -> None:
        payload = {"type": event_type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        await wire.write(self._response, payload, event=event_type)


async def _stream(
    request: web.Request, started: StartedTurn, fields: ResponseMeta
) -> web.StreamResponse:
    turn_id = started.turn_id
    item_id = f"{MESSAGE_PREFIX}{turn_id}"
    at = {"item_id": item_id, "output_index": 0, "content_index": 0}
    response = await open_event_stream(request)
    events = _EventWriter(response)
    pending = response_object(turn_id, fields, status="in_progress", outcome=None)
    async with wire.stopping_on_disconnect(request.app[TURNS], turn_id):
        await events.send("response.created", response=pending)
        await events.send("response.in_progress", response=pending)
        await events.send(
            "response.output_item.added",
            output_index=0,
            item=message_item(turn_id, "", "in_progress"),
        )
        empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        await events.send("response.content_part.added", part=empty_part, **at)
        async for event in follow(request.app[TURN_FOLLOWERS], turn_id):
            if isinstance(event, Delta):
                await events.send("response.output_text.delta", delta=event.text, logprobs=[], **at)
                continue
            status = final_status(event)
            final = response_object(turn_id, fields, status=status, outcome=event)
            if event.failed:
                await events.send("response.failed", response=final)
                break
            part = {**empty_part, "text": event.text}
            await events.send("response.output_text.done", text=event.text, logprobs=[], **at)
            await events.send("response.content_part.done", part=part, **at)
            await events.send(
                "response.output_item.done",
                output_index=0,
                item=message_item(turn_id, event.text, "completed"),
            )
            await events.send(f"response.{status}", response=final)
        await response.write_eof()
    return response


@chat_key
async def get_response(request: web.Request, principal: Principal) -> web.Response:
    requested = request.match_info["response_id"]
    turn_id = turn_id_of(requested)
    async with request.app[SESSIONS]() as session:
        stored = await find_response(session, principal.owner, turn_id) if turn_id else None
    if stored is None:
        return web.json_response(
            error_body(404, f"No response found with id {requested!r}.", NOT_FOUND_CODE),
            status=404,
        )
    turn = stored.turn
    fields = ResponseMeta(
        served_model(request.app[ENGINE_SETTINGS]),
        as_utc(turn.created_at).timestamp(),
        stored.exchange.previous_response_id,
        stored.exchange.stored,
    )
    if turn.status in TurnStatus.FINAL:
        outcome = outcome_of_row(turn)
        document = response_object(turn.id, fields, status=final_status(outcome), outcome=outcome)
    else:
        document = response_object(
            turn.id,
            fields,
            status=_STATUS.get(turn.status, "in_progress"),
            outcome=None,
            text_so_far=turn.reply_text or "",
        )
    return web.json_response(document)
