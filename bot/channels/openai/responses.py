"""``POST /v1/responses`` and ``GET /v1/responses/{id}``: the Responses API, stateful form.

With ``previous_response_id`` the client sends only the new input; the turn
extends that response's conversation, whose token ids are stored here, so the
prompt is the previous prompt + reply, id for id, and only the new input is
prefilled. That response must still be its conversation's latest when the new
turn is accepted: one that has moved on (another request continued it) is a
409 with the reason. Without it, ``input`` may carry a whole conversation as
messages and is matched like a chat-completions request. ``store: false``
keeps the response out of ``GET`` and ``previous_response_id`` (the turn itself
is stored and logged like every other: it is the conversation's history).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    CONFLICT_CODE,
    StartedTurn,
    admit,
    check_text,
    reserve_stream,
    served_model,
    start_turn,
)
from bot.channels.openai.messages import fold_messages
from bot.channels.openai.objects import (
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputText,
    Response,
    ResponseError,
    ResponseStatus,
    ResponseUsage,
)
from bot.channels.openai.requests import InputMessage, ResponsesRequest, Text
from bot.http.keys import ENGINE_SETTINGS, READ_SESSIONS, TURN_FOLLOWERS, TURNS
from bot.http.readers import StreamSlot
from bot.http.sse import open_event_stream
from bot.storage.exchanges import ExchangeRecord, StoredResponse, find_response
from bot.storage.models import TurnStatus, as_utc
from bot.storage.text import is_storable
from bot.turns.carried import CarriedHistory, ContinuedTurn, Exchange, extend_hash

API_NAME = "responses"
RESPONSE_PREFIX = "resp_"
MESSAGE_PREFIX = "msg_"
NOT_FOUND_CODE = "not_found"
PREVIOUS_PARAM = "previous_response_id"

# A stored turn's status as a Response's.
_STATUS: dict[str, ResponseStatus] = {
    TurnStatus.QUEUED: "queued",
    TurnStatus.RUNNING: "in_progress",
}


def response_id(turn_id: str) -> str:
    return f"{RESPONSE_PREFIX}{turn_id}"


def turn_id_of(response_id: str) -> str | None:
    if not response_id.startswith(RESPONSE_PREFIX) or not is_storable(response_id):
        return None
    return response_id.removeprefix(RESPONSE_PREFIX)


def input_messages(body: ResponsesRequest) -> list[InputMessage]:
    """``instructions`` and ``input`` as messages (``instructions`` as a system one)."""
    messages: list[InputMessage] = []
    if body.instructions:
        messages.append(InputMessage(role="system", content=body.instructions))
    if isinstance(body.input, str):
        messages.append(InputMessage(role="user", content=body.input))
        return messages
    return [*messages, *body.input]


def _usage(outcome: Outcome) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=outcome.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=outcome.cached_tokens),
        output_tokens=outcome.completion_tokens,
        total_tokens=outcome.prompt_tokens + outcome.completion_tokens,
    )


def message_item(turn_id: str, text: str, completed: bool) -> MessageItem:
    return MessageItem(
        id=f"{MESSAGE_PREFIX}{turn_id}",
        status="completed" if completed else "in_progress",
        content=[OutputText(text=text)] if text or completed else [],
    )


@dataclass(frozen=True)
class ResponseMeta:
    """What a Response object says about the request, whatever its state."""

    model: str
    created_at: float
    previous_response_id: str | None
    store: bool
    user: str | None = None


def response_object(
    turn_id: str,
    meta: ResponseMeta,
    *,
    status: ResponseStatus,
    outcome: Outcome | None,
    text_so_far: str = "",
) -> Response:
    text = outcome.text if outcome is not None else text_so_far
    output = (
        []
        if status == "failed" or not (text or outcome)
        else [message_item(turn_id, text, completed=outcome is not None)]
    )
    error = None
    if outcome is not None and outcome.failed:
        assert outcome.error_class is not None
        error = ResponseError(code=outcome.error_class.value, message=outcome.error_message)
    return Response(
        id=response_id(turn_id),
        created_at=int(meta.created_at),
        status=status,
        model=meta.model,
        output=output,
        usage=_usage(outcome) if outcome is not None and not outcome.failed else None,
        error=error,
        incomplete_details=IncompleteDetails() if status == "incomplete" else None,
        previous_response_id=meta.previous_response_id,
        store=meta.store,
        user=meta.user,
    )


def final_status(outcome: Outcome) -> ResponseStatus:
    if outcome.failed:
        return "failed"
    return "incomplete" if outcome.finish_reason == "length" else "completed"


def _not_found(previous: str) -> RequestRefused:
    return RequestRefused(
        openai_error(
            400,
            f"Previous response with id {previous!r} not found.",
            NOT_FOUND_CODE,
            param=PREVIOUS_PARAM,
        )
    )


def _continued(stored: StoredResponse, previous: str) -> ContinuedTurn:
    """The turn ``previous_response_id`` names, if it can be continued now (the accept
    checks again, atomically, that it is still its conversation's latest)."""
    turn = stored.turn
    if turn.status != TurnStatus.DONE or stored.conversation.closed_at is not None:
        state = "has not completed" if turn.status not in TurnStatus.FINAL else "cannot continue"
        raise RequestRefused(
            openai_error(
                409,
                f"Previous response {previous!r} {state}: continue from a completed response "
                "of an open conversation.",
                CONFLICT_CODE,
                param=PREVIOUS_PARAM,
            )
        )
    context_after = extend_hash(
        stored.exchange.context_hash, Exchange(turn.user_text, turn.reply_text or "")
    )
    return ContinuedTurn(turn.id, turn.conversation_id, turn.seq, context_after)


async def _previous_turn(
    request: web.Request, principal: Principal, previous: str, user: Text | None
) -> ContinuedTurn:
    turn_id = turn_id_of(previous)
    async with request.app[READ_SESSIONS]() as session:
        stored = await find_response(session, principal.owner, turn_id) if turn_id else None
    # Another end user's response (OpenAI's ``user``) is not this one's to continue.
    if stored is None or (stored.turn.user_id or None) != user:
        raise _not_found(previous)
    return _continued(stored, previous)


@chat_key
async def create_response(request: web.Request, principal: Principal) -> web.StreamResponse:
    slot: StreamSlot | None = None
    try:
        admitted, body = await admit(request, principal, ResponsesRequest)
        folded = fold_messages(input_messages(body), "input")
        carried = CarriedHistory(
            ExchangeRecord(API_NAME, body.store, body.previous_response_id),
            exchanges=folded.exchanges,
        )
        if body.previous_response_id:
            if folded.exchanges:
                raise bad_request(
                    "With previous_response_id, input holds only the new turn's messages.",
                    "input",
                )
            previous = await _previous_turn(
                request, principal, body.previous_response_id, body.user
            )
            carried = CarriedHistory(carried.record, previous=previous)
        check_text(request, folded.pending)
        slot = reserve_stream(request, principal) if body.stream else None
        started = await start_turn(
            request,
            admitted,
            text=folded.pending,
            carried=carried,
            sampling=body.sampling(),
            user_id=body.user,
        )
        fields = ResponseMeta(
            served_model(request.app[ENGINE_SETTINGS]),
            time.time(),
            body.previous_response_id,
            body.store,
            body.user,
        )
        if slot is not None:
            return await _stream(request, started, fields)
    except RequestRefused as exc:
        return exc.response
    finally:
        if slot is not None:
            slot.release()
    outcome = await settled(request.app[TURN_FOLLOWERS], started.turn_id)
    if isinstance(outcome, web.Response):
        return outcome
    document = response_object(
        started.turn_id, fields, status=final_status(outcome), outcome=outcome
    )
    return web.json_response(document.model_dump(mode="json"))


class _EventWriter:
    """Writes Responses API events with their running ``sequence_number``."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._sequence = 0

    async def send(self, event_type: str, **fields: object) -> None:
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
    pending_json = pending.model_dump(mode="json")
    async with wire.stopping_on_disconnect(request.app[TURNS], turn_id):
        await events.send("response.created", response=pending_json)
        await events.send("response.in_progress", response=pending_json)
        await events.send(
            "response.output_item.added",
            output_index=0,
            item=message_item(turn_id, "", completed=False).model_dump(mode="json"),
        )
        empty_part = OutputText(text="").model_dump(mode="json")
        await events.send("response.content_part.added", part=empty_part, **at)
        async for event in follow(request.app[TURN_FOLLOWERS], turn_id):
            if isinstance(event, Delta):
                await events.send("response.output_text.delta", delta=event.text, logprobs=[], **at)
                continue
            status = final_status(event)
            final = response_object(turn_id, fields, status=status, outcome=event)
            final_json = final.model_dump(mode="json")
            if event.failed:
                await events.send("response.failed", response=final_json)
                break
            part = {**empty_part, "text": event.text}
            await events.send("response.output_text.done", text=event.text, logprobs=[], **at)
            await events.send("response.content_part.done", part=part, **at)
            await events.send(
                "response.output_item.done",
                output_index=0,
                item=message_item(turn_id, event.text, completed=True).model_dump(mode="json"),
            )
            await events.send(f"response.{status}", response=final_json)
        await response.write_eof()
    return response


@chat_key
async def get_response(request: web.Request, principal: Principal) -> web.Response:
    requested = request.match_info["response_id"]
    turn_id = turn_id_of(requested)
    async with request.app[READ_SESSIONS]() as session:
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
        turn.user_id,
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
    return web.json_response(document.model_dump(mode="json"))
