"""``POST /v1/chat/completions``: the whole conversation as text in, one token-exact turn out.

The message list is matched against the key owner's stored conversations
(``threads``): a client that re-sends the text it was given continues its
conversation token-exactly, and ``usage.prompt_tokens_details.cached_tokens``
shows the prefix cache serving everything before the new message.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from bot.apikeys import Principal
from bot.channels.openai import wire
from bot.channels.openai.errors import RequestRefused, chat_key, turn_failure
from bot.channels.openai.events import Delta, Outcome, follow, settled
from bot.channels.openai.ingress import (
    StartedTurn,
    admit,
    check_text,
    find_thread,
    served_model,
    start_turn,
)
from bot.channels.openai.requests import ChatCompletionRequest, fold_messages
from bot.http.keys import ENGINE_SETTINGS, TURN_FOLLOWERS, TURNS
from bot.http.sse import open_event_stream

API_NAME = "chat.completions"
ID_PREFIX = "chatcmpl-"
FINISH_REASONS = frozenset({"stop", "length"})


def finish_reason(raw: str | None) -> str:
    return raw if raw in FINISH_REASONS else "stop"


def usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


@chat_key
async def create_chat_completion(request: web.Request, principal: Principal) -> web.StreamResponse:
    try:
        admitted, body = await admit(request, principal, ChatCompletionRequest)
        folded = fold_messages(body.messages, "messages")
        check_text(request, folded.pending)
        thread = await find_thread(request, admitted, folded.exchanges)
        started = await start_turn(
            request, admitted, thread=thread, text=folded.pending, api=API_NAME, user_id=body.user
        )
    except RequestRefused as exc:
        return exc.response
    model = served_model(request.app[ENGINE_SETTINGS])
    if body.stream:
        return await _stream(request, started, model, include_usage=body.include_usage)
    outcome = await settled(request.app[TURN_FOLLOWERS], started.turn_id)
    if isinstance(outcome, web.Response):
        return outcome
    return web.json_response(
        {
            "id": f"{ID_PREFIX}{started.turn_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": outcome.text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish_reason(outcome.finish_reason),
                }
            ],
            "usage": usage(outcome),
        }
    )


async def _stream(
    request: web.Request, started: StartedTurn, model: str, *, include_usage: bool
) -> web.StreamResponse:
    base = {
        "id": f"{ID_PREFIX}{started.turn_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        **({"usage": None} if include_usage else {}),
    }

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {**base, "choices": [choice]}

    response = await open_event_stream(request)
    async with wire.stopping_on_disconnect(request.app[TURNS], started.turn_id):
        await wire.write(response, chunk({"role": "assistant", "content": ""}))
        events = follow(request.app[TURN_FOLLOWERS], started.turn_id)
        async for event in events:
            if isinstance(event, Delta):
                await wire.write(response, chunk({"content": event.text}))
                continue
            if event.failed:
                assert event.error_class is not None
                # OpenAI SDKs raise on a chunk that carries an error object.
                await wire.write(response, turn_failure(event.error_class, event.error_message)[1])
                break
            await wire.write(response, chunk({}, finish_reason(event.finish_reason)))
            if include_usage:
                await wire.write(response, {**base, "choices": [], "usage": usage(event)})
            await response.write(wire.DONE_LINE)
        await response.write_eof()
    return response
