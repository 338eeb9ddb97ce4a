"""Mentions and DMs over Discord's gateway, fed into the same turn service as ``/ask``.

Discord sends plain messages (a mention in a server channel, a DM) only over
its gateway WebSocket. hikari's ``GatewayBot`` holds that connection: it
identifies, heartbeats, and after a dropped connection resumes the session, so
Discord replays what was missed. Its raw ``MESSAGE_CREATE`` payloads are read
here (``ShardPayloadEvent``; its cache is off) and parsed by the same pure
functions as the interactions (``payloads.py``).

Why hikari: it takes the REST base URL per bot (``rest_url``) and asks it for
the gateway's address, so every part of it can point at another server (the
tests' fakes) without touching a module global; discord.py reads both
addresses from class attributes. It is typed, and its gateway runs on aiohttp,
which the service already uses.

Order: payloads are queued as they arrive and accepted one at a time, so the
turn store numbers a conversation's messages in the order Discord sent them
and the turn service answers them in that order. A message replayed after a
resume is the same delivery (``message:{id}``): stored once, answered once.

Only the holder of the bot's gateway lease connects (``lease.py``); it
disconnects when the lease is lost, and another worker takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import hikari
import structlog
from aiohttp import web
from hikari.impl.config import CacheSettings, HTTPSettings, HTTPTimeoutSettings

from bot.channels.access import REFUSAL_CLASS
from bot.channels.discord.admission import refusal
from bot.channels.discord.channel import DiscordChannel
from bot.channels.discord.lease import AdvisoryLease, GatewayLease, ProcessLease
from bot.channels.discord.payloads import (
    GatewayMessage,
    Ignored,
    message_event_id,
    message_reply_to,
    parse_gateway_message,
    to_inbound,
)
from bot.channels.ingress import declined_too_long
from bot.channels.kind import Wiring
from bot.http.keys import DB_ENGINES

log = structlog.get_logger(__name__)

RECONNECT_BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 30.0)
"""Pauses before connecting again after the gateway refused or failed (the last repeats)."""
QUEUE_SIZE = 10_000


@dataclass(frozen=True)
class Received:
    """A ``MESSAGE_CREATE`` payload and when it came (the turn's latencies count from here)."""

    payload: dict[str, Any]
    at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)


def intents(groups: str) -> hikari.Intents:
    """What the bot asks the gateway for: server and DM messages; the privileged Message
    Content intent only to answer messages that do not mention it (``groups = "all"``):
    DMs and mentions carry their text without it."""
    wanted = hikari.Intents.GUILD_MESSAGES | hikari.Intents.DM_MESSAGES
    if groups == "all":
        wanted |= hikari.Intents.MESSAGE_CONTENT
    return wanted


class GatewayHolder:
    """One bot's gateway connection, held while this process holds its lease."""

    def __init__(self, channel: DiscordChannel, wiring: Wiring, lease: GatewayLease) -> None:
        self._channel = channel
        self._settings = channel.settings
        self._turns = wiring.turns
        self._max_text_chars = wiring.server.max_text_chars
        self._lease = lease
        self._queue: asyncio.Queue[Received] = asyncio.Queue(QUEUE_SIZE)
        self._bot_user_id: str | None = None
        self.connected = asyncio.Event()
        """Set while this process holds the gateway (tests and logs)."""

    # -- the connection ----------------------------------------------------------------

    def _bot(self) -> hikari.GatewayBot:
        bot = hikari.GatewayBot(
            self._settings.token.get_secret_value(),
            banner=None,
            logs=None,
            suppress_optimization_warning=True,
            intents=intents(self._settings.groups),
            rest_url=self._settings.api_base_url,
            cache_settings=CacheSettings(components=hikari.api.CacheComponents.NONE),
            http_settings=HTTPSettings(
                timeouts=HTTPTimeoutSettings(total=self._settings.request_timeout_s)
            ),
        )
        bot.subscribe(hikari.ShardPayloadEvent, self._on_payload)
        return bot

    async def run(self) -> None:
        """Hold the gateway whenever the lease is ours, until cancelled."""
        consumer = asyncio.create_task(
            self._consume(), name=f"discord-accept-{self._settings.name}"
        )
        failures = 0
        try:
            while True:
                await self._lease.acquire()
                log.info("discord_gateway_lease_taken", bot=self._settings.name)
                try:
                    failures = 0 if await self._connected() else failures + 1
                finally:
                    self.connected.clear()
                    await self._lease.release()
                if failures:
                    pause = RECONNECT_BACKOFF_S[min(failures, len(RECONNECT_BACKOFF_S)) - 1]
                    await asyncio.sleep(pause)
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer

    async def _connected(self) -> bool:
        """Run one gateway session until it ends or the lease is lost; False if it failed."""
        bot = self._bot()
        try:
            await bot.start(check_for_updates=False)
        except Exception as exc:
            log.warning("discord_gateway_failed", bot=self._settings.name, error=_describe(exc))
            await _close(bot)
            return False
        self.connected.set()
        log.info("discord_gateway_connected", bot=self._settings.name)
        lost = asyncio.create_task(self._lease.lost())
        closed = asyncio.create_task(bot.join())
        try:
            done, _ = await asyncio.wait({lost, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (lost, closed):
                task.cancel()
            await _close(bot)
        if lost in done:
            log.warning("discord_gateway_released", bot=self._settings.name, reason="lease lost")
            return True
        error = closed.exception() if not closed.cancelled() else None
        log.warning(
            "discord_gateway_closed",
            bot=self._settings.name,
            error=_describe(error) if error else None,
        )
        return error is None

    async def _on_payload(self, event: hikari.ShardPayloadEvent) -> None:
        if event.name == "READY":
            user = event.payload.get("user")
            if isinstance(user, dict) and isinstance(user.get("id"), str):
                self._bot_user_id = user["id"]
        elif event.name == "MESSAGE_CREATE":
            try:
                self._queue.put_nowait(Received(dict(event.payload)))
            except asyncio.QueueFull:
                log.warning("discord_gateway_queue_full", bot=self._settings.name)

    # -- the accept path ---------------------------------------------------------------

    async def _consume(self) -> None:
        while True:
            received = await self._queue.get()
            try:
                await self.handle(received.payload, received=received)
            except Exception:
                # The database refused (it is away): this message is lost to this run,
                # as a webhook's would be answered 5xx; the next ones are tried anew.
                log.exception("discord_gateway_accept_failed", bot=self._settings.name)

    async def handle(self, payload: dict[str, Any], *, received: Received | None = None) -> None:
        """Store and schedule one ``MESSAGE_CREATE`` payload, or decline or ignore it."""
        parsed = parse_gateway_message(
            payload, bot_user_id=self._bot_user_id, groups=self._settings.groups
        )
        if isinstance(parsed, Ignored):
            emit = log.info if parsed.known else log.warning
            emit("discord_message_ignored", bot=self._settings.name, reason=parsed.reason)
            return
        await self._accept(parsed, received or Received(payload))

    async def _accept(self, parsed: GatewayMessage, received: Received) -> None:
        settings = self._settings
        message = to_inbound(
            channel=settings.channel,
            event_id=message_event_id(parsed.message_id),
            text=parsed.text,
            place=parsed.place,
            reply_to=message_reply_to(parsed),
            # No request, no signature: the message's only layer before the accept is
            # its wait in the queue (the turn's ``ingress``).
            layer_ms={"ingress": (time.perf_counter() - received.started) * 1000, "auth": 0.0},
            received_at=received.at,
            unlimited=settings.is_admin(parsed.place.user_id),
        )
        fields = {"bot": settings.name, "message_id": parsed.message_id}
        refused = refusal(settings, parsed.place)
        if refused is not None:
            log.info("discord_refused", reason=refused, addressed=parsed.addressed, **fields)
            if parsed.addressed:  # chatter not meant for the bot gets no notice
                self._turns.decline(message, REFUSAL_CLASS, refused)
            return
        if declined_too_long(self._turns, message, self._max_text_chars):
            log.info("discord_declined", reason="text too long", **fields)
            return
        accepted = await self._turns.accept(message)
        log.info(
            "discord_accepted", turn_id=accepted.turn_id, duplicate=accepted.duplicate, **fields
        )


async def _close(bot: hikari.GatewayBot) -> None:
    with contextlib.suppress(Exception):
        if bot.is_alive:
            await bot.close()


def _describe(exc: BaseException) -> str:
    # hikari's errors may quote a response; they never hold the token. Keep it short.
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def build_lease(channel: DiscordChannel, app: web.Application) -> GatewayLease:
    engine = app[DB_ENGINES].requests
    if engine.dialect.name == "postgresql":
        return AdvisoryLease(
            engine.url,
            channel.settings.application_id,
            poll_s=channel.settings.gateway_lease_poll_s,
        )
    return ProcessLease()


GATEWAYS = web.AppKey("discord_gateways", dict[str, GatewayHolder])
"""Each gateway bot's holder by name, filled in once the app starts (tests read it)."""


def gateway_lifetime(
    channel: DiscordChannel, wiring: Wiring
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The app's ``cleanup_ctx`` entry that holds ``channel``'s gateway while the app runs."""

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        lease = build_lease(channel, app)
        holder = GatewayHolder(channel, wiring, lease)
        app[GATEWAYS][channel.settings.name] = holder
        task = asyncio.create_task(holder.run(), name=f"discord-gateway-{channel.settings.name}")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if isinstance(lease, AdvisoryLease):
            await lease.close()

    return lifetime
