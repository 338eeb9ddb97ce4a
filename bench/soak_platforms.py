"""The four ways in, played for bench/soak.py: how a message is sent and what came back for it.

Each player sends messages the way its platform does (the HTTP API with a key,
Telegram's webhook with its secret header, Slack's signed Events API, the
signed generic webhook) to a live worker picked at random, as a load balancer
would, and delivers again with the same id until a worker acknowledges it (a
worker killed or a database refusing the accept answers 503 or nothing; real
platforms retry too). The platforms' side is played by the strict fakes of
the test suite (bot/testing/) and, for the webhook, a recording receiver.

``finals()`` says, per accepted message, how many final answers its platform
got: replies and failure notices (an apology text). Telegram and Slack
messages carry no id of the message they answer, so there a player sends one
message of a chat at a time and attributes to it everything the chat got
until the chat's next message (``Sent.posted_at``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from platform_requests import (
    SLACK_CHANNEL,
    TELEGRAM_BOT,
    slack_headers,
    slack_mention,
    telegram_headers,
    telegram_update,
)

from bot.channels.webhook.signing import signed_headers
from bot.errors import USER_MESSAGES
from bot.testing.slack_api import PACED, FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from bot.turns.claims import INTERRUPTED_APOLOGY

NOTICES = frozenset({*USER_MESSAGES.values(), INTERRUPTED_APOLOGY})
"""What the service says instead of (or after) a reply."""
DELIVERY_RETRY_FOR_S = 90.0
"""How long a player keeps delivering one message before it counts it as not accepted."""
DELIVERY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
REQUEST_TIMEOUT_S = 15.0

WEBHOOK_NAME = "soak"
WEBHOOK_SECRET = "soak-webhook-secret-0123456789"


@dataclass
class Sent:
    """One message a player sent, and what became of it."""

    channel: str
    chat: str
    """Where its answers show up (a chat, a thread, a conversation)."""
    event_id: str
    """The id the service deduplicates it on (and stores in ``inbound_events``)."""
    posted_at: float
    turn_id: str | None = None
    accepted: bool = False
    ack_ms: float | None = None
    attempts: int = 0
    final: bool = False


@dataclass
class Finals:
    replies: int = 0
    notices: int = 0
    shown: list[tuple[float, str]] = field(default_factory=list)
    """(when, text) of each answer, for the report of an anomaly."""

    def add(self, at: float, kind: str, text: str) -> None:
        if kind == "notice":
            self.notices += 1
        else:
            self.replies += 1
        self.shown.append((at, text))


def is_notice(text: str) -> bool:
    return any(notice in text for notice in NOTICES)


class Workers:
    """The live workers' base URLs; the soak keeps it current as workers die and come back."""

    def __init__(self) -> None:
        self.urls: dict[str, str] = {}

    def pick(self, rng: random.Random) -> str | None:
        return rng.choice(sorted(self.urls.values())) if self.urls else None


async def deliver(
    http: aiohttp.ClientSession,
    workers: Workers,
    rng: random.Random,
    sent: Sent,
    path: str,
    body: bytes,
    headers: Callable[[], dict[str, str]],
) -> dict[str, Any] | None:
    """POST until a worker answers 2xx; set ``sent.accepted`` and the ack time of that attempt."""
    deadline = time.monotonic() + DELIVERY_RETRY_FOR_S
    for pause in itertools.chain(DELIVERY_BACKOFF_S, itertools.repeat(DELIVERY_BACKOFF_S[-1])):
        base = workers.pick(rng)
        if base is not None:
            sent.attempts += 1
            started = time.perf_counter()
            try:
                async with http.post(
                    base + path,
                    data=body,
                    headers={"Content-Type": "application/json", **headers()},
                    timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
                ) as response:
                    text = await response.text()
                    if 200 <= response.status < 300:
                        sent.ack_ms = (time.perf_counter() - started) * 1000
                        sent.accepted = True
                        return json.loads(text) if text.startswith("{") else {}
                    if response.status < 500 and response.status != 429:
                        raise RuntimeError(f"{path} refused a message: {response.status} {text}")
            except (aiohttp.ClientError, TimeoutError):
                pass  # the worker died or is restarting: deliver again, elsewhere
        if time.monotonic() + pause > deadline:
            return None
        await asyncio.sleep(pause)
    return None


# -- HTTP API --------------------------------------------------------------------------


class ApiPlayer:
    channel = "api"
    one_at_a_time = False

    def __init__(self, http: aiohttp.ClientSession, workers: Workers, key: str) -> None:
        self._http, self._workers, self._key = http, workers, key

    async def send(self, rng: random.Random, conversation: str, message_id: str, text: str) -> Sent:
        sent = Sent("api", conversation, message_id, time.monotonic())
        body = json.dumps(
            {"conversation_id": conversation, "message_id": message_id, "text": text}
        ).encode()
        answer = await deliver(
            self._http,
            self._workers,
            rng,
            sent,
            "/v1/messages",
            body,
            lambda: {"Authorization": f"Bearer {self._key}"},
        )
        if answer is not None:
            sent.turn_id = answer["turn_id"]
        return sent

    def finals(self, sents: list[Sent]) -> dict[str, Finals]:
        return {}  # no platform: the stream's last event is the answer (see the turn lines)


# -- generic webhook -------------------------------------------------------------------


@dataclass
class WebhookReceiver:
    """The integration's callback URL: answers 2xx, or an injected 503/429."""

    rng: random.Random
    url: str = ""
    failing: int = 0
    refused: int = 0
    delivered: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Callbacks answered 2xx, by ``X-Webhook-Delivery`` (a retry of one is the same callback)."""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/hook"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def calm(self) -> None:
        self.failing = 0

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.failing > 0:
            self.failing -= 1
            self.refused += 1
            if self.rng.random() < 0.5:
                return web.Response(status=429, headers={"Retry-After": "1"})
            return web.Response(status=503)
        delivery = request.headers.get("X-Webhook-Delivery", "")
        self.delivered[delivery] = json.loads(body)
        return web.Response(status=200)


class WebhookPlayer:
    channel = "webhook"
    one_at_a_time = False

    def __init__(
        self, http: aiohttp.ClientSession, workers: Workers, receiver: WebhookReceiver
    ) -> None:
        self._http, self._workers, self.receiver = http, workers, receiver

    async def send(self, rng: random.Random, conversation: str, message_id: str, text: str) -> Sent:
        sent = Sent("webhook", conversation, message_id, time.monotonic())
        body = json.dumps(
            {"conversation_id": conversation, "message_id": message_id, "text": text}
        ).encode()
        answer = await deliver(
            self._http,
            self._workers,
            rng,
            sent,
            f"/webhooks/{WEBHOOK_NAME}",
            body,
            lambda: signed_headers(WEBHOOK_SECRET, body),
        )
        if answer is not None:
            sent.turn_id = answer["turn_id"]
        return sent

    def finals(self, sents: list[Sent]) -> dict[str, Finals]:
        found = {sent.event_id: Finals() for sent in sents}
        for document in self.receiver.delivered.values():
            finals = found.get(document.get("in_reply_to", ""))
            if finals is None:
                continue
            if document.get("type") == "final":
                finals.add(0.0, "reply", str(document.get("text", "")))
            elif document.get("type") == "error":
                finals.add(0.0, "notice", str(document.get("message", "")))
        return found


# -- Telegram (private chats) ----------------------------------------------------------


class FlakyTelegram(FakeTelegram):
    """The strict fake, whose injected failures can be called off when the run is over."""

    def calm(self) -> None:
        self._rules.clear()


class TelegramPlayer:
    channel = "telegram"
    one_at_a_time = True

    def __init__(self, http: aiohttp.ClientSession, workers: Workers, fake: FlakyTelegram) -> None:
        self._http, self._workers, self.fake = http, workers, fake
        self._update_ids = itertools.count(600_000_000)

    async def send(self, rng: random.Random, conversation: str, message_id: str, text: str) -> Sent:
        update_id = next(self._update_ids)
        body = telegram_update(update_id, int(conversation), text)
        sent = Sent("telegram", conversation, str(update_id), time.monotonic())
        path = f"/telegram/{TELEGRAM_BOT}"
        await deliver(self._http, self._workers, rng, sent, path, body, telegram_headers)
        return sent

    def last_answer(self, sent: Sent) -> float | None:
        """When the chat last got a message since ``sent`` was posted (None: not yet)."""
        times = [
            call.at
            for call in self.fake.calls_of(chat_id=int(sent.chat))
            if call.ok and call.method == "sendMessage" and call.at >= sent.posted_at
        ]
        return max(times, default=None)

    def finals(self, sents: list[Sent]) -> dict[str, Finals]:
        shown = [
            (call.at, str(call.chat_id), str(call.params.get("text", "")))
            for call in self.fake.calls_of("sendMessage")
            if call.ok
        ]
        return _attribute(sents, shown)


# -- Slack (mentions in channel threads) -----------------------------------------------


class FlakySlack(FakeSlackApi):
    """The strict fake, plus Slack having a bad moment: the next calls answer 503."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.failing = 0
        self.refused = 0

    def calm(self) -> None:
        """No more injected failures (the run is over)."""
        self.failing = 0
        self._failures.clear()

    async def _handle(self, request: web.Request) -> web.Response:
        if self.failing > 0 and request.match_info["method"] in PACED:
            self.failing -= 1
            self.refused += 1
            await request.read()
            return web.json_response({"ok": False, "error": "service_unavailable"}, status=503)
        return await super()._handle(request)


class SlackPlayer:
    channel = "slack"
    one_at_a_time = True

    def __init__(self, http: aiohttp.ClientSession, workers: Workers, fake: FlakySlack) -> None:
        self._http, self._workers, self.fake = http, workers, fake
        self._ids = itertools.count(1)

    async def send(self, rng: random.Random, conversation: str, message_id: str, text: str) -> Sent:
        """``conversation`` is the thread's root ts; its first message is the root."""
        number = next(self._ids)
        event_id = f"Ev{number:08d}SOAK"
        if message_id:
            raw = slack_mention(event_id, f"{int(time.time())}.{number:06d}", conversation, text)
        else:
            raw = slack_mention(event_id, conversation, None, text)
        sent = Sent("slack", f"{SLACK_CHANNEL}:{conversation}", event_id, time.monotonic())

        def headers() -> dict[str, str]:
            return slack_headers(raw)

        await deliver(self._http, self._workers, rng, sent, "/slack/events", raw, headers)
        return sent

    def _created(self) -> list[tuple[float, str, str]]:
        """Messages the bot created in threads: (when, thread, text as shown now)."""
        created = []
        for call in self.fake.calls:
            if call.method not in ("chat.postMessage", "chat.startStream") or not call.ok:
                continue
            channel, ts = str(call.args.get("channel")), str(call.response.get("ts"))
            message = self.fake.messages.get((channel, ts))
            text = message.text if message is not None else ""
            created.append((call.at, f"{channel}:{call.args.get('thread_ts')}", text))
        return created

    def last_answer(self, sent: Sent) -> float | None:
        """When the thread last got a message since ``sent`` was posted (None: not yet)."""
        times = [
            at for at, chat, _ in self._created() if chat == sent.chat and at >= sent.posted_at
        ]
        return max(times, default=None)

    def finals(self, sents: list[Sent]) -> dict[str, Finals]:
        return _attribute(sents, self._created())


def _attribute(sents: list[Sent], shown: list[tuple[float, str, str]]) -> dict[str, Finals]:
    """Each message a chat got belongs to the chat's latest message sent before it."""
    by_chat: dict[str, list[Sent]] = {}
    for sent in sorted(sents, key=lambda s: s.posted_at):
        by_chat.setdefault(sent.chat, []).append(sent)
    found = {sent.event_id: Finals() for sent in sents}
    for at, chat, text in shown:
        earlier = [s for s in by_chat.get(chat, []) if s.posted_at <= at]
        if not earlier:
            continue
        found[earlier[-1].event_id].add(at, "notice" if is_notice(text) else "reply", text)
    return found


def count_finals(found: dict[str, Finals]) -> Counter[str]:
    """Answered twice (two replies or two notices), and replied-then-notified."""
    counts: Counter[str] = Counter()
    for finals in found.values():
        if finals.replies > 1 or finals.notices > 1:
            counts["twice"] += 1
        elif finals.replies and finals.notices:
            counts["reply_then_notice"] += 1
        elif not finals.replies and not finals.notices:
            counts["none"] += 1
    return counts
