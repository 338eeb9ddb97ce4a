"""``POST /discord/{name}``: the application's Interactions Endpoint URL.

1. Read the raw body (size-limited) and verify its Ed25519 signature
   (``signing.py``). Bad, missing or stale: 401, nothing parsed, nothing stored.
2. ``PING``: ``{"type": 1}``.
3. ``/ask``: the message is stored as a turn (deduplicated on the interaction
   id) and answered with a deferred response (type 5: "thinking…"); the reply
   then streams into that response (``deliveries.py``). Generation runs after
   the answer: Discord gives the handler 3 s.
4. The other commands act at once and answer in the response, to the user alone.

A refusal (the allow-list, ``groups = "off"``, a message too long, a fair-use
limit) is an ephemeral answer and stores nothing. The gateway's mentions and
DMs come in through ``gateway.py`` into the same turn service.
"""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web

from bot.channels.discord.admission import refusal
from bot.channels.discord.channel import DiscordChannel
from bot.channels.discord.commands import ASK, ASK_OPTION, EMPTY_ASK_TEXT, run_command
from bot.channels.discord.gateway import GATEWAYS, gateway_lifetime
from bot.channels.discord.payloads import (
    Autocomplete,
    MalformedInteraction,
    Ping,
    SlashCommand,
    interaction_event_id,
    interaction_reply_to,
    parse_interaction,
    to_inbound,
)
from bot.channels.discord.settings import DISCORD, DiscordBotSettings
from bot.channels.discord.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER
from bot.channels.ingress import IngressClock, too_long
from bot.channels.kind import Wiring
from bot.http.body import BodyError, load_json, read_body
from bot.http.errors import json_error
from bot.http.keys import USAGE

log = structlog.get_logger(__name__)

PATH = "/discord/{name}"
# Interaction callback types.
PONG = 1
CHANNEL_MESSAGE = 4
DEFERRED_CHANNEL_MESSAGE = 5
AUTOCOMPLETE_RESULT = 8
EPHEMERAL = 64
UNSUPPORTED_TEXT = "I do not handle that here."


def _ephemeral(text: str) -> web.Response:
    """An answer shown only to the user who typed the command; it pings nobody."""
    data = {"content": text, "flags": EPHEMERAL, "allowed_mentions": {"parse": []}}
    return web.json_response({"type": CHANNEL_MESSAGE, "data": data})


class DiscordRoutes:
    def __init__(self, channels: list[DiscordChannel], wiring: Wiring) -> None:
        self._channels = {channel.settings.name: channel for channel in channels}
        self._turns = wiring.turns
        self._server = wiring.server

    async def interaction(self, request: web.Request) -> web.StreamResponse:
        clock = IngressClock(request)
        channel = self._channels.get(request.match_info["name"])
        if channel is None:
            return json_error(404, "not_found", "no such Discord bot")
        try:
            raw = await read_body(request, self._server.max_body_bytes)
        except BodyError as exc:
            return exc.response
        with clock.measure("auth"):
            why = channel.verifier.verify(
                raw, request.headers.get(TIMESTAMP_HEADER), request.headers.get(SIGNATURE_HEADER)
            )
        if why is not None:
            log.warning("discord_signature_rejected", bot=channel.settings.name, reason=why)
            return json_error(401, "auth", "missing, invalid or expired Discord signature")
        try:
            parsed = parse_interaction(
                load_json(raw), application_id=channel.settings.application_id
            )
        except BodyError as exc:
            return exc.response
        except MalformedInteraction as exc:
            log.warning("discord_interaction_malformed", bot=channel.settings.name, error=str(exc))
            return json_error(400, "bad_request", f"not an interaction: {exc}")
        if isinstance(parsed, Ping):
            return web.json_response({"type": PONG})
        if isinstance(parsed, Autocomplete):
            return web.json_response({"type": AUTOCOMPLETE_RESULT, "data": {"choices": []}})
        if not isinstance(parsed, SlashCommand):
            log.info("discord_interaction_ignored", bot=channel.settings.name, kind=parsed.kind)
            return _ephemeral(UNSUPPORTED_TEXT)
        return await self._command(request, clock, channel, parsed)

    async def _command(
        self,
        request: web.Request,
        clock: IngressClock,
        channel: DiscordChannel,
        command: SlashCommand,
    ) -> web.Response:
        settings = channel.settings
        fields: dict[str, Any] = {
            "bot": settings.name,
            "command": command.name,
            "interaction_id": command.interaction_id,
            "channel_id": command.place.channel_id,
        }
        refused = refusal(settings, command.place)
        if refused is not None:
            log.info("discord_refused", reason=refused, **fields)
            return _ephemeral(refused)
        if command.name != ASK:
            answer = await run_command(
                command,
                channel=settings.channel,
                turns=self._turns,
                usage=request.app[USAGE],
                is_admin=settings.is_admin,
            )
            log.info("discord_command", answer=answer.splitlines()[0], **fields)
            return _ephemeral(answer)
        return await self._ask(clock, settings, command, fields)

    async def _ask(
        self,
        clock: IngressClock,
        settings: DiscordBotSettings,
        command: SlashCommand,
        fields: dict[str, Any],
    ) -> web.Response:
        text = command.options.get(ASK_OPTION, "").strip()
        if not text:
            return _ephemeral(EMPTY_ASK_TEXT)
        reason = too_long(text, self._server.max_text_chars)
        if reason is not None:
            log.info("discord_declined", reason="text too long", **fields)
            return _ephemeral(
                f"Sorry, your message is too long for me ({reason}). Please shorten it."
            )
        accepted = await self._turns.accept(
            to_inbound(
                channel=settings.channel,
                event_id=interaction_event_id(command.interaction_id),
                text=text,
                place=command.place,
                reply_to=interaction_reply_to(command, received_at=clock.received_at),
                layer_ms=clock.first_layers(),
                received_at=clock.received_at,
                unlimited=settings.is_admin(command.place.user_id),
            )
        )
        if accepted.rate_limited is not None:
            # The turn service tells the user (``decline``) by editing this response:
            # deferred ephemeral, so the notice is theirs alone. Nothing was stored.
            log.info("discord_rate_limited_user", **fields)
            return web.json_response(
                {"type": DEFERRED_CHANNEL_MESSAGE, "data": {"flags": EPHEMERAL}}
            )
        log.info(
            "discord_accepted",
            turn_id=accepted.turn_id,
            duplicate=accepted.duplicate,
            ack_ms=round(clock.elapsed_ms(), 3),
            **fields,
        )
        return web.json_response({"type": DEFERRED_CHANNEL_MESSAGE})


def setup(app: web.Application, tables: list[DiscordBotSettings], wiring: Wiring) -> None:
    channels = DISCORD.register(tables, wiring, lambda table: DiscordChannel(table, wiring.http))
    if not channels:
        return
    routes = DiscordRoutes(channels, wiring)
    app.router.add_post(PATH, routes.interaction)
    app[GATEWAYS] = {}
    for channel in channels:
        if channel.settings.gateway:
            app.cleanup_ctx.append(gateway_lifetime(channel, wiring))
