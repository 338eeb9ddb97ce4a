"""A recording callback receiver on loopback, and helpers to send signed webhook messages."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from bot.channels.webhook.signing import signed_headers

SECRET = "test-secret-0123456789abcdef"
NAME = "crm"


@dataclass(frozen=True)
class Callback:
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def document(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """Answers 2xx unless told to fail; records every attempt and what it answered."""

    url: str = ""
    attempts: list[Callback] = field(default_factory=list)
    fail_statuses: list[int] = field(default_factory=list)
    """Answer these statuses to the next attempts, one each, before answering 200 again."""
    fail_for_s: float = 0.0
    """Then answer 503 to every attempt until this long after the first attempt."""
    first_attempt_at: float | None = None
    always_fail: int | None = None
    drop_next: int = 0
    """Close the connection of the next attempts without an answer (and without taking them)."""
    late_next: int = 0
    """Take the next attempts (2xx), but answer them only after ``late_s``."""
    late_s: float = 0.0
    delay_s: float = 0.0
    in_flight: int = 0
    accepted_one: asyncio.Event = field(default_factory=asyncio.Event)
    arrived_one: asyncio.Event = field(default_factory=asyncio.Event)
    max_in_flight: int = 0

    @property
    def delivered(self) -> list[dict[str, Any]]:
        return [c.document for c in self.attempts if 200 <= c.status < 300]

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.in_flight += 1
        self.arrived_one.set()
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.drop_next:
                self.drop_next -= 1
                self.attempts.append(Callback(dict(request.headers), body, 0))
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)  # never sent: the connection is gone
            if self.late_next:
                self.late_next -= 1
                self.attempts.append(Callback(dict(request.headers), body, 200))
                await asyncio.sleep(self.late_s)
                return web.Response(status=200)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status = 200
            now = time.monotonic()
            if self.first_attempt_at is None:
                self.first_attempt_at = now
            if self.always_fail is not None:
                status = self.always_fail
            elif self.fail_statuses:
                status = self.fail_statuses.pop(0)
            elif now < self.first_attempt_at + self.fail_for_s:
                status = 503
            self.attempts.append(Callback(dict(request.headers), body, status))
            if 200 <= status < 300:
                self.accepted_one.set()
            return web.Response(status=status)
        finally:
            self.in_flight -= 1


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    recorder = Receiver()
    app = web.Application()
    app.router.add_post("/hook", recorder.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    recorder.url = str(server.make_url("/hook"))
    yield recorder
    await server.close()


def webhook_settings(receiver: Receiver, **overrides: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": NAME,
            "secret": SECRET,
            "callback_url": receiver.url,
            "allow_http_callback": True,  # the receiver is on loopback
            "chunk_interval_s": 0.0,
            "retry_backoff_s": 0.05,
            "retry_for_s": 5.0,
            **overrides,
        }
    ]


def message(
    message_id: str = "m1", conversation: str = "c1", text: str = "Hello!"
) -> dict[str, str]:
    return {"conversation_id": conversation, "message_id": message_id, "text": text}


async def post_signed(
    client: TestClient[Any, Any],
    document: dict[str, Any] | bytes,
    *,
    secret: str = SECRET,
    now: float | None = None,
    name: str = NAME,
) -> ClientResponse:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    headers = {"Content-Type": "application/json", **signed_headers(secret, body, now)}
    return await client.post(f"/webhooks/{name}", data=body, headers=headers)
