"""``GET /openapi.json``: the HTTP surface as OpenAPI 3.0, every route and every status it answers.

The document is written by hand, next to the handlers it describes, and kept
true by tests: every route the app serves must be in it (and nothing else),
and schemathesis fuzzes the live app from it, failing on any 5xx or on a
status the document does not list. Channel ingress routes (Telegram, Slack,
webhooks) exist only when configured, so the served document lists only the
paths this app actually routes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel

from bot.http.json_schema import openapi_schema

OPENAPI_PATH = "/openapi.json"
ID_MAX = 200  # the API's limit on conversation, message and user ids

_ERROR = {
    "type": "object",
    "required": ["error", "reason"],
    "properties": {"error": {"type": "string"}, "reason": {"type": "string"}},
}
_REASONS = {
    400: (
        "Malformed: bad JSON, missing or unknown fields, too long, an id holding U+0000 or "
        "an unpaired surrogate; nothing stored"
    ),
    401: "Missing, wrong, revoked or expired credentials (key, secret, signature)",
    403: "The API key lacks the scope this endpoint needs",
    404: "No such resource (another owner's turn, an unconfigured integration)",
    408: "The request body did not arrive within server.body_timeout_s",
    409: (
        "The turn cannot be regenerated, edited or activated now, a persona was given "
        "for a conversation started with another one, the message_id was already used "
        "for another message, or previous_response_id is no longer its conversation's "
        "latest (the reason says why); nothing stored"
    ),
    413: "The body is over server.max_body_bytes",
    429: "Over a fair-use limit; Retry-After says when to try again; nothing stored",
    503: "Not ready, the database did not answer, or a platform lookup failed; try again",
}
_BEARER: list[dict[str, list[str]]] = [{"apiKey": []}]
_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}
_OPENAI_REASONS = {
    **_REASONS,
    500: "The turn failed inside the service (error.code says which class)",
    503: "The engine or the database is unavailable; try again",
    504: "The engine did not answer in time",
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": _REASONS[status],
            "content": {"application/json": {"schema": _ERROR}},
        }
        for status in statuses
    }


def _openai_errors(*statuses: int) -> dict[str, Any]:
    """OpenAI-style error objects (``bot.channels.openai.errors``)."""
    return {
        str(status): {
            "description": _OPENAI_REASONS[status],
            "content": {"application/json": {"schema": _OPENAI_ERROR}},
        }
        for status in statuses
    }


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or {"type": "object"}}},
    }


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _raw_body(media_type: str) -> dict[str, Any]:
    return {"required": True, "content": {media_type: {"schema": {"type": "object"}}}}


_ID = {"type": "string", "minLength": 1, "maxLength": ID_MAX}
_MESSAGE_IN = {
    "type": "object",
    "additionalProperties": False,
    "required": ["conversation_id", "message_id", "text"],
    "properties": {
        "conversation_id": _ID,
        "message_id": _ID,
        "text": {"type": "string", "minLength": 1},
        "user_id": {"type": "string", "maxLength": ID_MAX, "nullable": True},
        "persona": {
            "type": "string",
            "maxLength": ID_MAX,
            "nullable": True,
            "description": (
                "A configured persona (GET /v1/personas) for a conversation this message "
                "starts. A persona is chosen when a conversation starts and never changes: "
                "its system prompt opens the history every later prompt (and the prefix "
                "cache) is built on. Unknown: 400. Given for an existing conversation "
                "started with another persona (or none): 409, nothing stored."
            ),
        },
    },
}
_PERSONAS = {
    "type": "object",
    "required": ["personas"],
    "properties": {
        "personas": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "description"],
                "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
            },
        }
    },
}
_EDIT_IN = {
    "type": "object",
    "additionalProperties": False,
    "required": ["text"],
    "properties": {"text": {"type": "string", "minLength": 1}},
}
_TIME = {"type": "string", "format": "date-time"}
_CONVERSATIONS = {
    "type": "object",
    "required": ["conversations", "next_cursor"],
    "properties": {
        "conversations": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["conversation_id", "title", "persona", "created_at", "updated_at"],
                "properties": {
                    "conversation_id": {"type": "string"},
                    "title": {"type": "string", "nullable": True},
                    "persona": {"type": "string", "nullable": True},
                    "created_at": _TIME,
                    "updated_at": _TIME,
                },
            },
        },
        "next_cursor": {"type": "string", "nullable": True},
    },
}
_SSE = {"description": "Server-Sent Events", "content": {"text/event-stream": {}}}

_PATHS: dict[str, dict[str, Any]] = {
    "/v1/messages": {
        "post": {
            "summary": "Send a message; 202 once stored, before the reply is generated",
            "security": _BEARER,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _MESSAGE_IN}},
            },
            "responses": {
                "200": _SSE,
                "202": _json("Stored (or a duplicate of a stored message): the turn"),
                **_errors(400, 401, 403, 408, 409, 413, 429, 503),
            },
        }
    },
    "/v1/personas": {
        "get": {
            "summary": "The personas (system-prompt presets) a new conversation can start with",
            "security": _BEARER,
            "responses": {
                "200": _json("The configured personas, in config order", _PERSONAS),
                **_errors(401, 403),
            },
        }
    },
    "/v1/turns/{turn_id}": {
        "get": {
            "summary": "A turn's status, reply, usage and timings",
            "security": _BEARER,
            "parameters": [_path_param("turn_id")],
            "responses": {"200": _json("The turn"), **_errors(400, 401, 403, 404)},
        }
    },
    "/v1/turns/{turn_id}/events": {
        "get": {
            "summary": "The reply as Server-Sent Events (Last-Event-ID resumes)",
            "security": _BEARER,
            "parameters": [
                _path_param("turn_id"),
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
            ],
            "responses": {"200": _SSE, **_errors(400, 401, 403, 404, 429)},
        }
    },
    "/v1/turns/{turn_id}/cancel": {
        "post": {
            "summary": "Stop a running turn or drop a queued one",
            "security": _BEARER,
            "parameters": [_path_param("turn_id")],
            "responses": {
                "200": _json("Whether it was cancelled"),
                **_errors(400, 401, 403, 404),
            },
        }
    },
    "/v1/turns/{turn_id}/regenerate": {
        "post": {
            "summary": "Answer the conversation's latest turn again, as a new attempt",
            "security": _BEARER,
            "parameters": [_path_param("turn_id")],
            "responses": {
                "200": _SSE,
                "202": _json("Stored: the new attempt's turn"),
                **_errors(400, 401, 403, 404, 409, 429),
            },
        }
    },
    "/v1/turns/{turn_id}/continue": {
        "post": {
            "summary": "Carry on the latest turn's reply, cut at the length limit, as a new "
            "attempt whose reply starts with it (continued_chars characters)",
            "security": _BEARER,
            "parameters": [_path_param("turn_id")],
            "responses": {
                "200": _SSE,
                "202": _json("Stored: the continuation's turn"),
                **_errors(400, 401, 403, 404, 409, 429),
            },
        }
    },
    "/v1/turns/{turn_id}/edit": {
        "post": {
            "summary": "Replace the latest turn's message and answer it, on a new branch",
            "security": _BEARER,
            "parameters": [_path_param("turn_id")],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _EDIT_IN}},
            },
            "responses": {
                "200": _SSE,
                "202": _json("Stored: the edited message's turn"),
                **_errors(400, 401, 403, 404, 408, 409, 413, 429),
            },
        }
    },
    "/v1/turns/{turn_id}/activate": {
        "post": {
            "summary": "Make the branch through this turn's reply the conversation's active one",
            "security": _BEARER,
            "parameters": [_path_param("turn_id")],
            "responses": {"200": _json("Activated"), **_errors(400, 401, 403, 404, 409)},
        }
    },
    "/v1/conversations": {
        "get": {
            "summary": "The key owner's API conversations, newest first, titled by the first "
            "words of their first message; next_cursor reads the next page",
            "security": _BEARER,
            "parameters": [
                {
                    "name": "limit",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                },
                {
                    "name": "cursor",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "maxLength": 200},
                    "description": "A previous page's next_cursor; anything else is a 400",
                },
            ],
            "responses": {
                "200": _json("A page of conversations", _CONVERSATIONS),
                **_errors(400, 401, 403, 503),
            },
        }
    },
    "/v1/conversations/{conversation_id}/turns": {
        "get": {
            "summary": "The active branch's turns, oldest first, with their alternatives",
            "security": _BEARER,
            "parameters": [_path_param("conversation_id")],
            "responses": {"200": _json("The turns"), **_errors(400, 401, 403, 404)},
        }
    },
    "/v1/usage": {
        "get": {
            "summary": "The key's turns and tokens today against its daily limit, and its "
            "owner's per UTC day and channel",
            "security": _BEARER,
            "parameters": [
                {
                    "name": "days",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 1, "maximum": 90, "default": 7},
                }
            ],
            "responses": {
                "200": _json("today (this key) and days (the owner's, oldest first)"),
                **_errors(400, 401, 403),
            },
        }
    },
    "/v1/chat/completions": {
        "post": {
            "summary": "OpenAI-compatible chat completions (docs/openai_api.md)",
            "security": _BEARER,
            "requestBody": _raw_body("application/json"),
            "responses": {
                "200": {
                    "description": "The completion, or its chunks as Server-Sent Events",
                    "content": {"application/json": {}, "text/event-stream": {}},
                },
                **_openai_errors(400, 401, 403, 404, 408, 413, 429, 500, 503, 504),
            },
        }
    },
    "/v1/responses": {
        "post": {
            "summary": "OpenAI-compatible responses, previous_response_id continues one",
            "security": _BEARER,
            "requestBody": _raw_body("application/json"),
            "responses": {
                "200": {
                    "description": "The response, or its events as Server-Sent Events",
                    "content": {"application/json": {}, "text/event-stream": {}},
                },
                **_openai_errors(400, 401, 403, 404, 408, 409, 413, 429, 500, 503, 504),
            },
        }
    },
    "/v1/responses/{response_id}": {
        "get": {
            "summary": "A stored response",
            "security": _BEARER,
            "parameters": [_path_param("response_id")],
            "responses": {
                "200": _json("The response"),
                **_openai_errors(400, 401, 403, 404),
            },
        }
    },
    "/v1/models": {
        "get": {
            "summary": "The served model",
            "security": _BEARER,
            "responses": {"200": _json("The model list"), **_openai_errors(401, 403)},
        }
    },
    "/v1/models/{model}": {
        "get": {
            "summary": "One model",
            "security": _BEARER,
            "parameters": [_path_param("model")],
            "responses": {"200": _json("The model"), **_openai_errors(400, 401, 403, 404)},
        }
    },
    "/healthz": {"get": {"summary": "Liveness", "responses": {"200": _json("Alive")}}},
    "/readyz": {
        "get": {
            "summary": "Readiness: database and engine answer, not draining",
            "responses": {"200": _json("Ready"), **_errors(503)},
        }
    },
    "/metrics": {
        "get": {
            "summary": "Prometheus metrics (an admin-scope key on this port)",
            "security": _BEARER,
            "responses": {
                "200": {"description": "Prometheus text", "content": {"text/plain": {}}},
                **_errors(401, 403),
            },
        }
    },
    OPENAPI_PATH: {"get": {"summary": "This document", "responses": {"200": _json("OpenAPI 3.0")}}},
    "/": {
        "get": {
            "summary": "The web chat page",
            "responses": {"200": {"description": "HTML", "content": {"text/html": {}}}},
        }
    },
    "/favicon.ico": {
        "get": {
            "summary": "The site's icon",
            "responses": {"200": {"description": "An icon", "content": {"image/x-icon": {}}}},
        }
    },
    "/static/{filename}": {
        "get": {
            "summary": "The web page's scripts and styles",
            "parameters": [_path_param("filename")],
            "responses": {"200": {"description": "The file"}, **_errors(400, 404)},
        }
    },
    "/telegram/{bot_name}": {
        "post": {
            "summary": "Telegram webhook; X-Telegram-Bot-Api-Secret-Token checked",
            "parameters": [_path_param("bot_name")],
            "requestBody": _raw_body("application/json"),
            "responses": {
                "200": {"description": "Acknowledged (answered or ignored)"},
                **_errors(400, 401, 404, 408, 413, 503),
            },
        }
    },
    "/slack/events": {
        "post": {
            "summary": "Slack Events API; X-Slack-Signature checked, 5-minute window",
            "requestBody": _raw_body("application/json"),
            "responses": {
                "200": {"description": "Acknowledged (answered or ignored)"},
                **_errors(400, 401, 408, 413),
            },
        }
    },
    "/slack/commands": {
        "post": {
            "summary": "Slack slash commands /new, /stop and /mode; signature checked",
            "requestBody": _raw_body("application/x-www-form-urlencoded"),
            "responses": {
                "200": {"description": "The command's answer"},
                **_errors(400, 401, 408, 413),
            },
        }
    },
    "/discord/{name}": {
        "post": {
            "summary": "Discord interactions endpoint; Ed25519 signature checked, 5-minute window",
            "parameters": [_path_param("name")],
            "requestBody": _raw_body("application/json"),
            "responses": {
                "200": _json("The interaction's response (pong, deferred, or a notice)"),
                **_errors(400, 401, 404, 408, 413),
            },
        }
    },
    "/webhooks/{name}": {
        "post": {
            "summary": "Signed generic webhook (docs/webhook.md)",
            "parameters": [_path_param("name")],
            "requestBody": _raw_body("application/json"),
            "responses": {
                "202": _json("Stored (or a duplicate): the turn"),
                **_errors(400, 401, 404, 408, 409, 413, 429),
            },
        }
    },
}


def routed_paths(app: web.Application) -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every route of ``app``."""
    found = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue  # aiohttp adds HEAD beside every GET
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("formatter") or info.get("path")
        if path is not None:
            found.add((route.method.lower(), str(path)))
    return found


REQUEST_MODELS = web.AppKey("openapi_request_models", dict[tuple[str, str], type[BaseModel]])
"""(method, path) -> the pydantic model of its JSON body, for the routes that declare one."""


def describe_body(app: web.Application, method: str, path: str, model: type[BaseModel]) -> None:
    """Document ``method path``'s JSON body as ``model`` (a route's typed request)."""
    app.setdefault(REQUEST_MODELS, {})[(method.lower(), path)] = model


def document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI document of the paths ``app`` routes."""
    routed = routed_paths(app)
    paths = {
        path: {method: dict(op) for method, op in operations.items() if (method, path) in routed}
        for path, operations in _PATHS.items()
    }
    schemas: dict[str, Any] = {}
    for (method, path), model in app.get(REQUEST_MODELS, {}).items():
        operation = paths.get(path, {}).get(method)
        if operation is None:
            continue
        schema, components = openapi_schema(model)
        schemas.update(components)
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    return {
        "openapi": "3.0.3",
        "info": {"title": "llm-chat-bot", "version": "1"},
        "paths": {path: operations for path, operations in paths.items() if operations},
        "components": {
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
            **({"schemas": schemas} if schemas else {}),
        },
    }


def documented_paths() -> set[tuple[str, str]]:
    """Every (method, path) the document can describe."""
    return {(method, path) for path, ops in _PATHS.items() for method in ops}


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(document(request.app))


def setup(app: web.Application) -> None:
    app.router.add_get(OPENAPI_PATH, openapi_json)
