"""A strict fake of Discord's HTTP API on loopback, for tests.

It answers like Discord (JSON errors with ``message`` and ``code``) and checks
every call, stricter than Discord where that catches a bug:

- the bot token in ``Authorization: Bot ...`` on bot routes (401 ``{"message":
  "401: Unauthorized", "code": 0}`` without it);
- interaction webhooks: a token Discord has not seen answered with a deferred
  response is unknown (404, code 10015 "Unknown Webhook"); one past its 15
  minutes is refused (401, code 50027 "Invalid Webhook Token");
- message bodies: only known fields; ``content`` a non-empty string of at most
  2,000 characters (50035 / 50006); ``allowed_mentions`` must parse nothing
  (this service never pings anyone: anything else is recorded in ``pings``);
- rate limits, per route and major parameter: ``limit`` calls per ``window_s``
  with ``X-RateLimit-Limit/Remaining/Reset/Reset-After/Bucket`` on every answer;
  a call over the limit gets 429 with Discord's JSON body (``message``,
  ``retry_after`` in seconds, ``global``) and ``Retry-After``. A call that comes
  while a 429's ``retry_after`` still runs is counted in ``violations``.
  ``rate_limit_next`` and ``fail_next`` inject a 429 or a 5xx on a route.

Tests read ``calls``, ``interaction_messages(token)``, ``channel_messages(id)``,
``violations``, ``pings``, ``rejected``.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_CONTENT = 2000
TOKEN_LIFETIME_S = 15 * 60.0
MESSAGE_FIELDS = {"content", "allowed_mentions", "message_reference", "flags"}
NO_MENTIONS: dict[str, list[str]] = {"parse": []}


@dataclass
class FakeMessage:
    id: str
    content: str
    edits: int = 0
    reference: str | None = None


@dataclass
class FakeInteraction:
    token: str
    channel_id: str
    created_at: float
    ephemeral: bool
    messages: list[FakeMessage] = field(default_factory=list)
    """``@original`` first, then the follow-ups."""


@dataclass
class Bucket:
    used: int = 0
    window_ends: float = 0.0
    blocked_until: float = 0.0


@dataclass
class Call:
    method: str
    route: str
    at: float
    status: int
    body: Any = None


class FakeDiscordApi:
    def __init__(
        self,
        *,
        token: str,
        application_id: str,
        public_key: str,
        bot_user_id: str,
        limit: int = 5,
        window_s: float = 1.0,
    ) -> None:
        self.token = token
        self.application_id = application_id
        self.public_key = public_key
        self.bot_user_id = bot_user_id
        self.limit = limit
        self.window_s = window_s
        self.interactions_endpoint_url: str | None = None
        self.gateway_url = "ws://127.0.0.1:1/"
        self.commands: list[Any] = []
        self.interactions: dict[str, FakeInteraction] = {}
        self.channels: dict[str, list[FakeMessage]] = {}
        self.calls: list[Call] = []
        self.violations: list[str] = []
        self.pings: list[Any] = []
        self.rejected: list[tuple[str, int, str]] = []
        self._buckets: dict[tuple[str, str, str], Bucket] = {}
        self._injected: list[tuple[str, int, float]] = []
        self._ids = itertools.count(1_300_000_000_000_000_000)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    # -- lifetime -------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/v10/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}/api/v10"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- what tests set up and read ---------------------------------------------------

    def acknowledge(self, token: str, channel_id: str, response: dict[str, Any]) -> None:
        """Discord read the app's answer to an interaction: from now on its webhook exists."""
        data = response.get("data") or {}
        interaction = FakeInteraction(
            token, channel_id, time.time(), ephemeral=bool(data.get("flags", 0) & 64)
        )
        if response.get("type") == 4:
            interaction.messages.append(FakeMessage(self._next_id(), data.get("content", "")))
        elif response.get("type") == 5:
            interaction.messages.append(FakeMessage(self._next_id(), ""))  # "thinking…"
        self.interactions[token] = interaction

    def interaction_messages(self, token: str) -> list[str]:
        return [message.content for message in self.interactions[token].messages]

    def channel_messages(self, channel_id: str) -> list[FakeMessage]:
        return list(self.channels.get(channel_id, []))

    def rate_limit_next(self, route: str, retry_after: float) -> None:
        """The next call on ``route`` (a template) gets 429 with this ``retry_after``."""
        self._injected.append((route, 429, retry_after))

    def fail_next(self, route: str, status: int = 502, *, times: int = 1) -> None:
        """The next ``times`` calls on ``route`` get ``status`` (a 5xx: Discord's own trouble)."""
        self._injected.extend([(route, status, 0.0)] * times)

    def drop_next(self, route: str) -> None:
        """The next call on ``route`` has its connection closed without an answer, before
        the call is carried out."""
        self._injected.append((route, 0, 0.0))

    def calls_on(self, route: str) -> list[Call]:
        return [call for call in self.calls if call.route == route]

    # -- the API ----------------------------------------------------------------------

    def _next_id(self) -> str:
        return str(next(self._ids))

    def _error(self, status: int, message: str, code: int, route: str) -> web.Response:
        self.rejected.append((route, status, message))
        return web.json_response({"message": message, "code": code}, status=status)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = request.match_info["tail"].split("/")
        method = request.method
        arrived = time.time()  # before anything of ours runs: the time the client sent it
        body: Any = None
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return self._error(400, "400: Bad Request", 0, "?")
        route, major, handler = self._route(method, parts)
        if handler is None:
            return self._error(404, "404: Not Found", 0, f"{method} ?")
        now = time.monotonic()
        bucket = self._buckets.setdefault((method, route, major), Bucket())
        if self._drops_next(route):
            self.calls.append(Call(method, route, arrived, 0, body))
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never sent: the connection is gone
        limited = self._limited(route, bucket, now)
        if limited is not None:
            self.calls.append(Call(method, route, arrived, limited.status, body))
            return limited
        response: web.StreamResponse = await handler(request, parts, body)
        self.calls.append(Call(method, route, arrived, response.status, body))
        self._count(bucket, now, response)
        return response

    def _drops_next(self, route: str) -> bool:
        for index, (injected_route, status, _) in enumerate(self._injected):
            if injected_route == route:
                if status != 0:
                    return False
                del self._injected[index]
                return True
        return False

    def _limited(self, route: str, bucket: Bucket, now: float) -> web.Response | None:
        if bucket.blocked_until > now:
            self.violations.append(route)
            return self._too_many(route, bucket.blocked_until - now)
        for index, (injected_route, status, retry_after) in enumerate(self._injected):
            if injected_route == route:
                del self._injected[index]
                if status == 429:
                    bucket.blocked_until = now + retry_after
                    return self._too_many(route, retry_after)
                return self._error(status, f"{status}: Server Error", 0, route)
        if now >= bucket.window_ends:
            bucket.used, bucket.window_ends = 0, now + self.window_s
        if bucket.used >= self.limit:
            # The client was told Remaining 0 and when the bucket resets: it should have waited.
            self.violations.append(route)
            return self._too_many(route, bucket.window_ends - now)
        return None

    def _too_many(self, route: str, retry_after: float) -> web.Response:
        self.rejected.append((route, 429, "rate limited"))
        response = web.json_response(
            {
                "message": "You are being rate limited.",
                "retry_after": round(retry_after, 3),
                "global": False,
            },
            status=429,
        )
        response.headers["Retry-After"] = str(math.ceil(retry_after))
        response.headers["X-RateLimit-Limit"] = str(self.limit)
        response.headers["X-RateLimit-Remaining"] = "0"
        response.headers["X-RateLimit-Reset-After"] = f"{retry_after:.3f}"
        response.headers["X-RateLimit-Scope"] = "user"
        return response

    def _count(self, bucket: Bucket, now: float, response: web.StreamResponse) -> None:
        bucket.used += 1
        reset_after = max(0.0, bucket.window_ends - now)
        response.headers["X-RateLimit-Limit"] = str(self.limit)
        response.headers["X-RateLimit-Remaining"] = str(max(0, self.limit - bucket.used))
        response.headers["X-RateLimit-Reset"] = f"{time.time() + reset_after:.3f}"
        response.headers["X-RateLimit-Reset-After"] = f"{reset_after:.3f}"
        response.headers["X-RateLimit-Bucket"] = "fakebucket"

    def _route(self, method: str, parts: list[str]) -> tuple[str, str, Any]:
        match (method, parts):
            case ("GET", ["users", "@me"]):
                return "GET /users/@me", "", self._me
            case ("GET", ["applications", "@me"]):
                return "GET /applications/@me", "", self._application
            case ("GET", ["gateway", "bot"]):
                return "GET /gateway/bot", "", self._gateway
            case ("PUT", ["applications", _app, "commands"]):
                return "PUT /applications/{id}/commands", _app, self._put_commands
            case ("PUT", ["applications", _app, "guilds", guild, "commands"]):
                return "PUT /applications/{id}/guilds/{id}/commands", guild, self._put_commands
            case ("POST", ["channels", channel, "messages"]):
                return "POST /channels/{id}/messages", channel, self._create_message
            case ("PATCH", ["channels", channel, "messages", _message]):
                return "PATCH /channels/{id}/messages/{id}", channel, self._edit_message
            case ("POST", ["webhooks", _app, token]):
                return "POST /webhooks/{id}/{token}", token, self._follow_up
            case ("PATCH", ["webhooks", _app, token, "messages", _message]):
                return "PATCH /webhooks/{id}/{token}/messages/{id}", token, self._edit_webhook
        return "", "", None

    def _bot_auth(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bot {self.token}"

    def _unauthorized(self, route: str) -> web.Response:
        return self._error(401, "401: Unauthorized", 0, route)

    async def _me(self, request: web.Request, parts: list[str], body: Any) -> web.Response:
        if not self._bot_auth(request):
            return self._unauthorized("GET /users/@me")
        return web.json_response(
            {
                "id": self.bot_user_id,
                "username": "testbot",
                "discriminator": "0",
                "bot": True,
                "avatar": None,
                "global_name": None,
            }
        )

    async def _application(self, request: web.Request, parts: list[str], body: Any) -> web.Response:
        if not self._bot_auth(request):
            return self._unauthorized("GET /applications/@me")
        return web.json_response(
            {
                "id": self.application_id,
                "name": "Test bot",
                "verify_key": self.public_key,
                "interactions_endpoint_url": self.interactions_endpoint_url,
            }
        )

    async def _gateway(self, request: web.Request, parts: list[str], body: Any) -> web.Response:
        if not self._bot_auth(request):
            return self._unauthorized("GET /gateway/bot")
        return web.json_response(
            {
                "url": self.gateway_url,
                "shards": 1,
                "session_start_limit": {
                    "total": 1000,
                    "remaining": 999,
                    "reset_after": 14400000,
                    "max_concurrency": 1,
                },
            }
        )

    async def _put_commands(
        self, request: web.Request, parts: list[str], body: Any
    ) -> web.Response:
        if not self._bot_auth(request):
            return self._unauthorized("PUT commands")
        if not isinstance(body, list) or not all(isinstance(c, dict) for c in body):
            return self._error(400, "Invalid Form Body", 50035, "PUT commands")
        for command in body:
            name = command.get("name")
            if not isinstance(name, str) or not name.islower() or not 1 <= len(name) <= 32:
                return self._error(400, "Invalid Form Body", 50035, "PUT commands")
            if not 1 <= len(command.get("description", "")) <= 100:
                return self._error(400, "Invalid Form Body", 50035, "PUT commands")
        self.commands = [{**command, "id": self._next_id()} for command in body]
        return web.json_response(self.commands)

    def _check_message(self, body: Any, route: str, *, create: bool) -> web.Response | None:
        if not isinstance(body, dict) or set(body) - MESSAGE_FIELDS:
            return self._error(400, "Invalid Form Body", 50035, route)
        content = body.get("content")
        if not isinstance(content, str) or len(content) > MAX_CONTENT:
            return self._error(400, "Invalid Form Body", 50035, route)
        if create and not content.strip():
            return self._error(400, "Cannot send an empty message", 50006, route)
        if body.get("allowed_mentions") != NO_MENTIONS:
            self.pings.append(body.get("allowed_mentions"))
        return None

    async def _create_message(
        self, request: web.Request, parts: list[str], body: Any
    ) -> web.Response:
        route = "POST /channels/{id}/messages"
        if not self._bot_auth(request):
            return self._unauthorized(route)
        refused = self._check_message(body, route, create=True)
        if refused is not None:
            return refused
        reference = body.get("message_reference")
        message = FakeMessage(
            self._next_id(),
            body["content"],
            reference=reference.get("message_id") if isinstance(reference, dict) else None,
        )
        self.channels.setdefault(parts[1], []).append(message)
        return web.json_response(
            {"id": message.id, "channel_id": parts[1], "content": message.content}
        )

    async def _edit_message(
        self, request: web.Request, parts: list[str], body: Any
    ) -> web.Response:
        route = "PATCH /channels/{id}/messages/{id}"
        if not self._bot_auth(request):
            return self._unauthorized(route)
        refused = self._check_message(body, route, create=False)
        if refused is not None:
            return refused
        for message in self.channels.get(parts[1], []):
            if message.id == parts[3]:
                message.content = body["content"]
                message.edits += 1
                return web.json_response({"id": message.id, "content": message.content})
        return self._error(404, "Unknown Message", 10008, route)

    def _interaction(self, parts: list[str], route: str) -> FakeInteraction | web.Response:
        if parts[1] != self.application_id:
            return self._error(404, "Unknown Webhook", 10015, route)
        interaction = self.interactions.get(parts[2])
        if interaction is None:
            return self._error(404, "Unknown Webhook", 10015, route)
        if time.time() - interaction.created_at > TOKEN_LIFETIME_S:
            return self._error(401, "Invalid Webhook Token", 50027, route)
        return interaction

    async def _follow_up(self, request: web.Request, parts: list[str], body: Any) -> web.Response:
        route = "POST /webhooks/{id}/{token}"
        found = self._interaction(parts, route)
        if isinstance(found, web.Response):
            return found
        refused = self._check_message(body, route, create=True)
        if refused is not None:
            return refused
        message = FakeMessage(self._next_id(), body["content"])
        found.messages.append(message)
        if request.query.get("wait") != "true":
            return web.Response(status=204)
        return web.json_response({"id": message.id, "content": message.content})

    async def _edit_webhook(
        self, request: web.Request, parts: list[str], body: Any
    ) -> web.Response:
        route = "PATCH /webhooks/{id}/{token}/messages/{id}"
        found = self._interaction(parts, route)
        if isinstance(found, web.Response):
            return found
        refused = self._check_message(body, route, create=False)
        if refused is not None:
            return refused
        wanted = parts[4]
        for index, message in enumerate(found.messages):
            if (wanted == "@original" and index == 0) or message.id == wanted:
                message.content = body["content"]
                message.edits += 1
                return web.json_response({"id": message.id, "content": message.content})
        return self._error(404, "Unknown Message", 10008, route)
