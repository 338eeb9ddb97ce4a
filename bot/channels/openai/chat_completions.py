"""``POST /v1/chat/completions``: the whole conversation as text in, one token-exact turn out.

The message list is matched against the key owner's stored conversations
(``bot.turns.carried``): a client that re-sends the text it was given
continues its conversation token-exactly, and
``usage.prompt_tokens_details.cached_tokens`` shows the prefix cache serving
everything before the new message.
"""

from __future__ import annotations

import time

from aiohttp import web

from bot.apikeys import Principal
from bot.channels.openai import wire
from bot.channels.openai.errors import RequestRefused, chat_key, turn_failure
from bot.channels.openai.events import Delta, Outcome, follow, settled
from bot.channels.openai.ingress import (
    StartedTurn,
    admit,
    check_text,
    reserve_stream,
    served_model,
    start_turn,
)
from bot.channels.openai.messages import fold_messages
from bot.channels.openai.objects import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    PromptTokensDetails,
    Usage,
    finish_reason,
)
from bot.channels.openai.objects import Delta as ChunkDelta
from bot.channels.openai.requests import ChatCompletionRequest
from bot.http.keys import ENGINE_SETTINGS, TURN_FOLLOWERS, TURNS
from bot.http.readers import StreamSlot
from bot.http.sse import open_event_stream
from bot.storage.exchanges import ExchangeRecord
from bot.turns.carried import CarriedHistory

API_NAME = "chat.completions"
ID_PREFIX = "chatcmpl-"


def usage(outcome: Outcome) -> Usage:
    return Usage(
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        total_tokens=outcome.prompt_tokens + outcome.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=outcome.cached_tokens),
    )


@chat_key
async def create_chat_completion(request: web.Request, principal: Principal) -> web.StreamResponse:
    slot: StreamSlot | None = None
    try:
        admitted, body = await admit(request, principal, ChatCompletionRequest)
        folded = fold_messages(body.messages, "messages")
        check_text(request, folded.pending)
        # A stream holds one of the key's stream slots; over the cap nothing is stored.
        slot = reserve_stream(request, principal) if body.stream else None
        started = await start_turn(
            request,
            admitted,
            text=folded.pending,
            carried=CarriedHistory(ExchangeRecord(API_NAME), exchanges=folded.exchanges),
            sampling=body.sampling(),
            user_id=body.user,
        )
        model = served_model(request.app[ENGINE_SETTINGS])
        if slot is not None:
            return await _stream(request, started, model, include_usage=body.include_usage)
    except RequestRefused as exc:
        return exc.response
    finally:
        if slot is not None:
            slot.release()
    outcome = await settled(request.app[TURN_FOLLOWERS], started.turn_id)
    if isinstance(outcome, web.Response):
        return outcome
    completion = ChatCompletion(
        id=f"{ID_PREFIX}{started.turn_id}",
        created=int(time.time()),
        model=model,
        choices=[
            Choice(
                message=AssistantMessage(content=outcome.text),
                finish_reason=finish_reason(outcome.finish_reason),
            )
        ],
        usage=usage(outcome),
    )
    return web.json_response(completion.model_dump(mode="json"))


async def _stream(
    request: web.Request, started: StartedTurn, model: str, *, include_usage: bool
) -> web.StreamResponse:
    created = int(time.time())

    def chunk(delta: ChunkDelta, reason: str | None = None) -> dict[str, object]:
        document = ChatCompletionChunk(
            id=f"{ID_PREFIX}{started.turn_id}",
            created=created,
            model=model,
            choices=[
                ChunkChoice(delta=delta, finish_reason=finish_reason(reason) if reason else None)
            ],
        ).model_dump(mode="json")
        if not include_usage:
            del document["usage"]  # present (null) only when the client asked for usage
        return document

    response = await open_event_stream(request)
    async with wire.stopping_on_disconnect(request.app[TURNS], started.turn_id):
        await wire.write(response, chunk(ChunkDelta(role="assistant", content="")))
        events = follow(request.app[TURN_FOLLOWERS], started.turn_id)
        async for event in events:
            if isinstance(event, Delta):
                await wire.write(response, chunk(ChunkDelta(content=event.text)))
                continue
            if event.failed:
                assert event.error_class is not None
                # OpenAI SDKs raise on a chunk that carries an error object.
                await wire.write(response, turn_failure(event.error_class, event.error_message)[1])
                break
            await wire.write(response, chunk(ChunkDelta(), event.finish_reason or "stop"))
            if include_usage:
                last = ChatCompletionChunk(
                    id=f"{ID_PREFIX}{started.turn_id}",
                    created=created,
                    model=model,
                    choices=[],
                    usage=usage(event),
                )
                await wire.write(response, last.model_dump(mode="json"))
            await response.write(wire.DONE_LINE)
        await response.write_eof()
    return response
