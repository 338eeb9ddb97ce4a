"""``POST /webhooks/{name}``: verify, parse, persist, acknowledge. Generation runs after the 202.

1. Unknown integration name: 404.
2. Read the raw body (size-limited) and check ``X-Webhook-Signature`` over
   ``{X-Webhook-Timestamp}.{body}`` with the integration's secret, within the
   replay window. Otherwise 401: nothing parsed, nothing stored.
3. Parse ``{"conversation_id", "message_id", "text", "user_id"?, "user_name"?}``
   (400 with a reason when malformed or too long; nothing stored).
4. ``TurnService.accept`` stores it deduplicated on ``(webhook:{name}, message_id)``
   and the 202 goes out; a redelivery answers with the same turn, and a message_id
   reused for another text or conversation is a 409 ``conflict``. Over a fair-use
   limit: 429 with ``Retry-After``, nothing stored, and no callback (the 429 is
   the answer).
"""

from __future__ import annotations

import structlog
from aiohttp import web
from pydantic import Field

from bot.channels.base import InboundMessage
from bot.channels.ids import ID_MAX
from bot.channels.ingress import (
    IngressClock,
    PostedMessage,
    rate_limited,
    read_posted,
)
from bot.channels.kind import Wiring
from bot.channels.webhook.channel import WebhookChannel
from bot.channels.webhook.settings import WEBHOOK, WebhookSettings
from bot.channels.webhook.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify_any
from bot.http.body import BodyError, read_body
from bot.http.errors import json_error

log = structlog.get_logger(__name__)


class WebhookMessage(PostedMessage):
    user_name: str | None = Field(default=None, max_length=ID_MAX)
    """When set, the model sees ``"{user_name}: {text}"`` (for group conversations)."""


class WebhookEvents:
    def __init__(self, channels: list[WebhookChannel], wiring: Wiring) -> None:
        self._channels = {channel.settings.name: channel for channel in channels}
        self._turns = wiring.turns
        self._server = wiring.server

    async def handle(self, request: web.Request) -> web.StreamResponse:
        clock = IngressClock(request)
        name = request.match_info["name"]
        channel = self._channels.get(name)
        if channel is None:
            return json_error(404, "not_found", f"no webhook integration named {name!r}")
        try:
            body = await read_body(request, self._server.max_body_bytes)
        except BodyError as exc:
            return exc.response
        with clock.measure("auth"):
            refused = verify_any(
                channel.accepted_secrets,
                request.headers.get(TIMESTAMP_HEADER),
                request.headers.get(SIGNATURE_HEADER),
                body,
            )
        if refused is not None:
            log.warning("webhook_signature_rejected", webhook=name, reason=refused)
            return json_error(401, "auth", f"{refused}; see docs/webhook.md")
        message = await read_posted(request, WebhookMessage, self._server, body)
        if isinstance(message, web.Response):
            return message

        accepted = await self._turns.accept(
            InboundMessage(
                channel=channel.name,
                event_id=message.message_id,
                owner=channel.name,
                conversation_key=message.conversation_id,
                text=message.text,
                user_id=message.user_id,
                user_name=message.user_name,
                reply_to={
                    "conversation_id": message.conversation_id,
                    "message_id": message.message_id,
                },
                layer_ms=clock.first_layers(),
                received_at=clock.received_at,
            )
        )
        if accepted.rate_limited is not None:
            return rate_limited(accepted.rate_limited)
        if accepted.id_conflict is not None:
            log.info("webhook_message_id_reused", webhook=name, turn_id=accepted.turn_id)
            return json_error(409, "conflict", accepted.id_conflict, turn_id=accepted.turn_id)
        log.info(
            "webhook_message",
            webhook=name,
            message_id=message.message_id,
            turn_id=accepted.turn_id,
            duplicate=accepted.duplicate,
        )
        return web.json_response(
            {"turn_id": accepted.turn_id, "duplicate": accepted.duplicate}, status=202
        )


def setup(app: web.Application, tables: list[WebhookSettings], wiring: Wiring) -> None:
    channels = WEBHOOK.register(tables, wiring, lambda table: WebhookChannel(table, wiring.http))
    if channels:
        app.router.add_post("/webhooks/{name}", WebhookEvents(channels, wiring).handle)
