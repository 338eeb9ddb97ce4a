"""A small aiohttp server on 127.0.0.1 that answers /v1/completions the wrong way, on purpose."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def _sse(*events: dict[str, Any] | str) -> bytes:
    parts = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return "".join(parts).encode()


CHUNK = {"choices": [{"index": 0, "text": "hi", "token_ids": [5], "finish_reason": None}]}
LAST = {
    "choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


@dataclass
class MisbehavingServer:
    mode: str = "status"
    """How ``/v1/completions`` misbehaves. ``/health`` is never served (404), as if each
    check missed its timeout."""
    status: int = 500
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "other-model"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        mode = self.mode
        if mode == "status":
            body = {"error": {"message": f"status {self.status}", "code": self.status}}
            return web.json_response(body, status=self.status)
        if mode == "html":
            return web.Response(text="<html>Bad gateway</html>", content_type="text/html")
        if mode == "hang":
            await asyncio.sleep(2)
            return web.Response(status=204)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if mode == "not_json":
            await response.write(b"data: this is not json\n\n")
        elif mode == "no_choices":
            await response.write(_sse({"id": "x", "object": "text_completion"}))
        elif mode == "drop_after_first":
            # One token reaches the client, then the server goes away mid-reply.
            await response.write(_sse(CHUNK))
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.close()
            return response
        elif mode in ("ok", "slow"):
            # A correct reply of one token. "slow" takes its time: the stream opens, then
            # (a long queue of prefills) its first token 2 s later, a pause, the end.
            slow = mode == "slow"
            await asyncio.sleep(2.0 if slow else 0)
            await response.write(_sse(CHUNK))
            await asyncio.sleep(0.5 if slow else 0)
            await response.write(_sse(LAST, "[DONE]"))
        await response.write_eof()
        return response
