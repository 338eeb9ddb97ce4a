"""Registers the OpenAI-compatible endpoints: chat completions, responses, models."""

from __future__ import annotations

import time

from aiohttp import web

from bot.apikeys import Principal
from bot.channels.base import SilentChannel
from bot.channels.kind import Wiring
from bot.channels.openai.chat_completions import create_chat_completion
from bot.channels.openai.errors import chat_key, openai_error
from bot.channels.openai.ingress import served_model
from bot.channels.openai.kind import OPENAI
from bot.channels.openai.requests import ChatCompletionRequest, ResponsesRequest
from bot.channels.openai.responses import create_response, get_response
from bot.errors import ErrorClass
from bot.http.keys import ENGINE_SETTINGS
from bot.http.openapi import describe_body

MODEL_OWNER = "llm-chat-bot"


def _model_document(model: str) -> dict[str, object]:
    return {"id": model, "object": "model", "created": int(time.time()), "owned_by": MODEL_OWNER}


@chat_key
async def list_models(request: web.Request, principal: Principal) -> web.Response:
    model = served_model(request.app[ENGINE_SETTINGS])
    return web.json_response({"object": "list", "data": [_model_document(model)]})


@chat_key
async def retrieve_model(request: web.Request, principal: Principal) -> web.Response:
    model = served_model(request.app[ENGINE_SETTINGS])
    if request.match_info["model"] != model:
        return openai_error(
            404,
            f"The model {request.match_info['model']!r} does not exist.",
            ErrorClass.MODEL_NOT_FOUND.value,
        )
    return web.json_response(_model_document(model))


def setup(app: web.Application, wiring: Wiring) -> None:
    wiring.turns.register_channel(SilentChannel(OPENAI.name))
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_post("/v1/responses", create_response)
    describe_body(app, "post", "/v1/chat/completions", ChatCompletionRequest)
    describe_body(app, "post", "/v1/responses", ResponsesRequest)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
