"""A strict fake of the Telegram Bot API on loopback, for tests.

It answers like Telegram (``{"ok": false, "error_code": ..., "description":
...}`` with Telegram's wording) and checks every call the way Telegram does:
the bot token, the method name, required fields and their types, text of 1 to
4096 characters after entities parsing (counted in UTF-16 units, the stricter
count), HTML entities, the message to edit exists and was sent by this bot,
"message is not modified", drafts only in private chats, and 429 with
``retry_after`` when calls to one chat come faster than the configured
interval (then every call to that chat gets 429 until the wait is over).

Deliberately stricter than Telegram in one way: an unknown parameter is a
400 (Telegram ignores it silently), so a misspelt field fails a test instead
of being dropped.

Tests read ``calls`` (every call, answered or refused), ``messages(chat_id)``
(what the chat shows now), ``drafts``, and ``flood_violations`` (calls that
came while the chat was told to wait), and inject failures with ``fail``,
``inject_flood``, ``drop_connection``, ``revoke``, ``block``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from bot.testing.telegram_methods import (
    CHAT_ACTIONS,
    COUNTED,
    MISSING,
    NOT_MODIFIED,
    SIGNATURES,
    ApiRefusal,
    FakeBot,
    RecordedCall,
    StoredMessage,
    bad,
    message_json,
    message_thread,
    read_params,
    read_text,
)


@dataclass
class FailRule:
    error_code: int
    description: str
    method: str | None
    chat_id: int | None
    times: int
    retry_after: int | None = None
    drop: bool = False


class _DropConnection(Exception):
    """Close the connection without an answer, before the call is carried out."""


@dataclass
class _ChatFlood:
    last_counted: float = -math.inf
    penalty_until: float = -math.inf


@dataclass
class FakeTelegram:
    """The fake server; ``async with FakeTelegram() as tg`` serves on ``tg.base_url``."""

    flood_interval_private_s: float | None = None
    flood_interval_group_s: float | None = None
    flood_retry_after_s: int = 1
    latency_s: float = 0.0
    clock: Callable[[], float] = time.monotonic

    bots: dict[str, FakeBot] = field(default_factory=dict)
    calls: list[RecordedCall] = field(default_factory=list)
    flood_violations: list[RecordedCall] = field(default_factory=list)
    drafts: dict[tuple[int, int | None, int], list[str]] = field(default_factory=dict)
    _messages: dict[tuple[int, int], dict[int, StoredMessage]] = field(default_factory=dict)
    _next_message_id: dict[tuple[int, int], int] = field(default_factory=dict)
    _flood: dict[tuple[int, int], _ChatFlood] = field(default_factory=dict)
    _rules: list[FailRule] = field(default_factory=list)
    _blocked: set[tuple[int, int]] = field(default_factory=set)
    _runner: web.AppRunner | None = None
    _http: aiohttp.ClientSession | None = None
    base_url: str = ""
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    # -- lifecycle ---------------------------------------------------------------

    async def __aenter__(self) -> FakeTelegram:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- set-up and injection ----------------------------------------------------

    def add_bot(self, token: str, username: str, first_name: str = "Test Bot") -> FakeBot:
        bot_id = int(token.split(":", 1)[0])
        bot = FakeBot(token=token, id=bot_id, username=username, first_name=first_name)
        self.bots[token] = bot
        return bot

    def revoke(self, token: str) -> None:
        """The token was revoked with @BotFather: every call gets 401."""
        self.bots[token].revoked = True

    def block(self, token: str, chat_id: int) -> None:
        """The user blocked the bot: sends to that chat get 403."""
        self._blocked.add((self.bots[token].id, chat_id))

    def fail(
        self,
        error_code: int,
        description: str,
        *,
        method: str | None = None,
        chat_id: int | None = None,
        times: int = 1,
        retry_after: int | None = None,
    ) -> None:
        """Refuse the next ``times`` matching calls with this error."""
        self._rules.append(FailRule(error_code, description, method, chat_id, times, retry_after))

    def drop_connection(
        self, *, method: str | None = None, chat_id: int | None = None, times: int = 1
    ) -> None:
        """Close the connection of the next ``times`` matching calls without answering them
        (a proxy or Telegram's front end failing); the calls are not carried out."""
        self._rules.append(FailRule(0, "connection dropped", method, chat_id, times, drop=True))

    def inject_flood(
        self, chat_id: int, retry_after: int = 1, *, method: str | None = None
    ) -> None:
        """The next counted call to ``chat_id`` gets 429 and opens a penalty of ``retry_after``."""
        self._rules.append(
            FailRule(429, "Too Many Requests: retry after", method, chat_id, 1, retry_after)
        )

    # -- inspection ----------------------------------------------------------------

    def messages(self, chat_id: int, token: str | None = None) -> list[StoredMessage]:
        """The chat's messages from the bot, oldest first, as they read now."""
        bots = [self.bots[token]] if token else list(self.bots.values())
        found: list[StoredMessage] = []
        for bot in bots:
            found.extend(self._messages.get((bot.id, chat_id), {}).values())
        return sorted(found, key=lambda m: m.message_id)

    def texts(self, chat_id: int) -> list[str]:
        return [message.text for message in self.messages(chat_id)]

    def calls_of(self, method: str | None = None, chat_id: int | None = None) -> list[RecordedCall]:
        return [
            call
            for call in self.calls
            if (method is None or call.method == method)
            and (chat_id is None or call.chat_id == chat_id)
        ]

    async def wait_until(
        self, predicate: Callable[[], bool], within: float = 30.0, what: str = "condition"
    ) -> None:
        """Wait until ``predicate()`` holds, re-checking after every call."""
        deadline = time.monotonic() + within
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {what}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.2))

    # -- webhook delivery (Telegram's side) -----------------------------------------

    async def push_update(self, token: str, update: dict[str, Any]) -> int:
        """POST ``update`` to the bot's webhook as Telegram does; returns the HTTP status."""
        bot = self.bots[token]
        if not bot.webhook_url:
            raise AssertionError("no webhook set for this bot")
        headers = {}
        if bot.webhook_secret:
            headers["X-Telegram-Bot-Api-Secret-Token"] = bot.webhook_secret
        if self._http is None:
            self._http = aiohttp.ClientSession()
        async with self._http.post(bot.webhook_url, json=update, headers=headers) as response:
            if response.status != 200:
                bot.last_error_message = f"Wrong response from the webhook: {response.status}"
            return response.status

    # -- the API -------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        method = request.match_info["method"]
        params = await read_params(request)
        call = RecordedCall(bot=token, method=method, params=params, at=self.clock())
        self.calls.append(call)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        try:
            result = self._dispatch(token, method, params, call)
        except _DropConnection:
            call.ok, call.description = False, "connection dropped"
            self._changed.set()
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never sent: the connection is gone
        except ApiRefusal as refusal:
            call.ok = False
            call.error_code, call.description = refusal.error_code, refusal.description
            response = web.json_response(refusal.body(), status=refusal.error_code)
        else:
            response = web.json_response({"ok": True, "result": result})
        self._changed.set()
        return response

    def _dispatch(self, token: str, method: str, params: dict[str, Any], call: RecordedCall) -> Any:
        bot = self.bots.get(token)
        if bot is None or bot.revoked:
            raise ApiRefusal(401, "Unauthorized")
        handler = getattr(self, f"_m_{method}", None)
        if method not in SIGNATURES or handler is None:
            raise ApiRefusal(404, "Not Found")
        required, optional = SIGNATURES[method]
        for name in params:
            if name not in required | optional:
                raise bad(f"fake: unknown parameter {name!r} for {method}")
        self._check_flood(bot, method, params, call)
        self._check_rules(bot, method, params)
        for name in sorted(required):
            if name not in params:
                raise bad(MISSING.get(name, f"parameter {name} is required"))
        return handler(bot, params)

    def _check_rules(self, bot: FakeBot, method: str, params: dict[str, Any]) -> None:
        for rule in self._rules:
            if rule.times <= 0:
                continue
            if rule.method is not None and rule.method != method:
                continue
            if rule.chat_id is not None and rule.chat_id != params.get("chat_id"):
                continue
            if rule.error_code == 429 and method not in COUNTED:
                continue
            rule.times -= 1
            if rule.drop:
                raise _DropConnection
            description = rule.description
            if rule.error_code == 429 and rule.retry_after is not None:
                description = f"Too Many Requests: retry after {rule.retry_after}"
                chat_id = params.get("chat_id")
                if isinstance(chat_id, int):
                    self._flood_state(bot.id, chat_id).penalty_until = (
                        self.clock() + rule.retry_after
                    )
            raise ApiRefusal(rule.error_code, description, rule.retry_after)

    def _flood_state(self, bot_id: int, chat_id: int) -> _ChatFlood:
        return self._flood.setdefault((bot_id, chat_id), _ChatFlood())

    def _check_flood(
        self, bot: FakeBot, method: str, params: dict[str, Any], call: RecordedCall
    ) -> None:
        chat_id = params.get("chat_id")
        if not isinstance(chat_id, int):
            return
        state = self._flood_state(bot.id, chat_id)
        now = self.clock()
        if now < state.penalty_until:
            self.flood_violations.append(call)
            wait = max(1, math.ceil(state.penalty_until - now))
            raise ApiRefusal(429, f"Too Many Requests: retry after {wait}", wait)
        if method not in COUNTED:
            return
        interval = self.flood_interval_private_s if chat_id > 0 else self.flood_interval_group_s
        if interval is not None and now - state.last_counted < interval:
            wait = self.flood_retry_after_s
            state.penalty_until = now + wait
            raise ApiRefusal(429, f"Too Many Requests: retry after {wait}", wait)
        state.last_counted = now

    # -- methods ---------------------------------------------------------------------

    def _m_getMe(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        return {
            **bot.user(),
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _target_chat(self, bot: FakeBot, params: dict[str, Any]) -> int:
        chat_id = params.get("chat_id")
        if isinstance(chat_id, str) and chat_id.lstrip("-").isdigit():
            chat_id = int(chat_id)
        if not isinstance(chat_id, int):
            raise bad("chat not found")
        if (bot.id, chat_id) in self._blocked:
            raise ApiRefusal(403, "Forbidden: bot was blocked by the user")
        return chat_id

    def _m_sendMessage(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        chat_id = self._target_chat(bot, params)
        text, entities, parse_mode = read_text(params)
        reply_to: int | None = None
        reply = params.get("reply_parameters")
        if reply is not None:
            if not isinstance(reply, dict) or not isinstance(reply.get("message_id"), int):
                raise bad("fake: reply_parameters must be an object with an integer message_id")
            reply_to = reply["message_id"]
        key = (bot.id, chat_id)
        message_id = self._next_message_id.get(key, 1000)
        self._next_message_id[key] = message_id + 1
        message = StoredMessage(
            message_id=message_id,
            chat_id=chat_id,
            text=text,
            entities=entities,
            source=params["text"],
            parse_mode=parse_mode,
            message_thread_id=message_thread(params),
            reply_to_message_id=reply_to,
        )
        self._messages.setdefault(key, {})[message_id] = message
        return message_json(bot, message)

    def _m_editMessageText(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        if "inline_message_id" in params:
            raise bad("fake: inline messages are not implemented by this fake")
        if "chat_id" not in params:
            raise bad("chat_id is empty")
        chat_id = self._target_chat(bot, params)
        message_id = params.get("message_id")
        if not isinstance(message_id, int):
            raise bad("message identifier is not specified")
        text, entities, parse_mode = read_text(params)
        message = self._messages.get((bot.id, chat_id), {}).get(message_id)
        if message is None:
            raise bad("message to edit not found")
        if message.text == text and message.entities == entities:
            raise bad(NOT_MODIFIED.removeprefix("Bad Request: "))
        message.text, message.entities = text, entities
        message.source, message.parse_mode = params["text"], parse_mode
        message.edits += 1
        return message_json(bot, message)

    def _m_sendMessageDraft(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        chat_id = self._target_chat(bot, params)
        if chat_id <= 0:
            raise bad("fake: drafts can be sent only to private chats")
        draft_id = params.get("draft_id")
        if not isinstance(draft_id, int) or draft_id == 0:
            raise bad("fake: draft_id must be a non-zero integer")
        text, _entities, _mode = read_text(params)
        self.drafts.setdefault((chat_id, message_thread(params), draft_id), []).append(text)
        return True

    def _m_sendChatAction(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        self._target_chat(bot, params)
        if params.get("action") not in CHAT_ACTIONS:
            raise bad("wrong parameter action in request")
        message_thread(params)
        return True

    def _m_setWebhook(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        url = params.get("url")
        if not isinstance(url, str):
            raise bad("fake: url must be a string")
        secret = params.get("secret_token")
        if secret is not None and (
            not isinstance(secret, str)
            or not 1 <= len(secret) <= 256
            or any(not (c.isascii() and (c.isalnum() or c in "_-")) for c in secret)
        ):
            raise bad("secret token contains unallowed characters")
        allowed = params.get("allowed_updates")
        if allowed is not None and not isinstance(allowed, list):
            raise bad("fake: allowed_updates must be a list")
        bot.webhook_url, bot.webhook_secret = url, secret
        bot.allowed_updates = allowed
        if params.get("drop_pending_updates"):
            bot.pending_update_count = 0
        return True

    def _m_getWebhookInfo(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        info: dict[str, Any] = {
            "url": bot.webhook_url,
            "has_custom_certificate": False,
            "pending_update_count": bot.pending_update_count,
        }
        if bot.webhook_url:
            info["max_connections"] = 40
            info["ip_address"] = "127.0.0.1"
            if bot.allowed_updates is not None:
                info["allowed_updates"] = bot.allowed_updates
        if bot.last_error_message:
            info["last_error_date"] = int(time.time())
            info["last_error_message"] = bot.last_error_message
        return info

    def _m_deleteWebhook(self, bot: FakeBot, params: dict[str, Any]) -> Any:
        bot.webhook_url, bot.webhook_secret, bot.allowed_updates = "", None, None
        if params.get("drop_pending_updates"):
            bot.pending_update_count = 0
        return True
