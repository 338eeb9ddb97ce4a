"""Small OpenAI-compatible servers on loopback, healthy or misbehaving in one chosen way.

Written against the plain HTTP API (``GET /v1/models``, ``POST /v1/completions``),
so the doctor's remote check is tested without any engine client code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from aiohttp import web

Behaviour = Literal[
    "healthy", "unauthorized", "not_found", "model_missing", "silent", "malformed_json", "html"
]
API_KEY = "sk-test-remote"
SERVED = "demo"


def _app(behaviour: Behaviour) -> web.Application:
    async def models(request: web.Request) -> web.StreamResponse:
        if behaviour == "silent":
            await asyncio.sleep(3600)
        if behaviour == "not_found":
            raise web.HTTPNotFound(text="404: Not Found")
        if behaviour == "html":
            return web.Response(text="<html>proxy login</html>", content_type="text/html")
        if (
            request.headers.get("Authorization") != f"Bearer {API_KEY}"
            or behaviour == "unauthorized"
        ):
            return web.json_response({"error": "Unauthorized"}, status=401)
        if behaviour == "malformed_json":
            return web.Response(
                text='{"object": "list", "data": [', content_type="application/json"
            )
        served = "another-model" if behaviour == "model_missing" else SERVED
        return web.json_response({"object": "list", "data": [{"id": served, "object": "model"}]})

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("model") != SERVED:
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "code": 404,
                    }
                },
                status=404,
            )
        assert isinstance(body["prompt"], list) and all(isinstance(i, int) for i in body["prompt"])
        assert body["max_tokens"] == 1
        return web.json_response(
            {
                "object": "text_completion",
                "model": SERVED,
                "choices": [{"index": 0, "text": "a", "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1},
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


@asynccontextmanager
async def openai_server(behaviour: Behaviour) -> AsyncIterator[str]:
    """Serve on 127.0.0.1 and yield the base URL."""
    runner = web.AppRunner(_app(behaviour), access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
