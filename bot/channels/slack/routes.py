"""``POST /slack/events``: verify, parse, persist, acknowledge. Generation runs after the 200.

1. Read the raw body (size-limited) and find the app whose signing secret
   signs it: slack_sdk's ``SignatureVerifier`` (HMAC-SHA256 over
   ``v0:{timestamp}:{body}``, constant-time compare, 5-minute window). No
   match: 401, nothing parsed, nothing stored.
2. ``url_verification``: echo the challenge.
3. Ignored events (bots, edits, other subtypes...): 200, nothing stored.
4. A user message: ``TurnService.accept`` stores it deduplicated on
   ``(channel, event_id)`` with its queued turn, and the 200 goes out. A
   Slack retry (``X-Slack-Retry-Num``) of an event already stored is a
   duplicate and is only acknowledged; a retry whose first delivery never
   reached us is stored and answered like a first delivery.

A 5xx (e.g. the database is down) makes Slack retry later, which is what we want.
"""

from __future__ import annotations

import json
import time

import aiohttp
import structlog
from aiohttp import web

from bot.channels.base import too_long_notice
from bot.channels.slack.channel import SlackChannel
from bot.channels.slack.events import (
    Ignored,
    MalformedEvent,
    UrlVerification,
    parse_body,
    to_inbound,
)
from bot.config import Settings
from bot.errors import ErrorClass
from bot.http.body import BodyError, read_body
from bot.http.errors import json_error
from bot.http.keys import REQUEST_RECEIVED_AT, REQUEST_STARTED
from bot.turns.service import TurnService

log = structlog.get_logger(__name__)

EVENTS_PATH = "/slack/events"


def _signed_by(
    channels: list[SlackChannel], body: bytes, request: web.Request
) -> list[SlackChannel]:
    timestamp = request.headers.get("X-Slack-Request-Timestamp")
    signature = request.headers.get("X-Slack-Signature")
    if not timestamp or not signature:
        return []
    matches = []
    for channel in channels:
        try:
            if channel.verifier.is_valid(body=body, timestamp=timestamp, signature=signature):
                matches.append(channel)
        except (ValueError, UnicodeDecodeError):
            # A timestamp that is no integer, a body that is no UTF-8: not from Slack.
            return []
    return matches


class SlackEvents:
    """The request handler, holding the configured apps."""

    def __init__(
        self, channels: list[SlackChannel], turns: TurnService, settings: Settings
    ) -> None:
        self._channels = channels
        self._turns = turns
        self._max_body = settings.server.max_body_bytes
        self._max_text = settings.server.max_text_chars

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = request.get(REQUEST_STARTED, time.perf_counter())
        retry_num = request.headers.get("X-Slack-Retry-Num")
        retry_reason = request.headers.get("X-Slack-Retry-Reason")
        try:
            body = await read_body(request, self._max_body)
        except BodyError as exc:
            return exc.response

        auth_started = time.perf_counter()
        signed = _signed_by(self._channels, body, request)
        auth_ms = (time.perf_counter() - auth_started) * 1000
        if not signed:
            log.warning("slack_signature_rejected", retry_num=retry_num)
            return json_error(401, "auth", "missing, invalid or expired Slack signature")

        ingress_started = time.perf_counter()
        try:
            document = json.loads(body)
            parsed = parse_body(document)
        except (UnicodeDecodeError, json.JSONDecodeError, MalformedEvent) as exc:
            log.warning("slack_event_malformed", error=str(exc))
            return json_error(400, "bad_request", "not an Events API payload")
        if isinstance(parsed, UrlVerification):
            # Carries no api_app_id; a valid signature is all Slack asks us to prove.
            return web.json_response({"challenge": parsed.challenge})
        channel = _pick(signed, document.get("api_app_id"))
        if channel is None:
            log.warning("slack_event_for_another_app", api_app_id=document.get("api_app_id"))
            return web.Response(status=200)
        if isinstance(parsed, Ignored):
            emit = log.warning if parsed.unknown else log.info
            emit(
                "slack_event_ignored",
                app=channel.settings.name,
                kind=parsed.kind,
                reason=parsed.reason,
                event_id=parsed.event_id,
                retry_num=retry_num,
            )
            return web.Response(status=200)
        if len(parsed.text) > self._max_text:
            log.warning(
                "slack_event_ignored",
                app=channel.settings.name,
                kind="too_long",
                reason=f"{len(parsed.text)} characters; the limit is {self._max_text}",
                event_id=parsed.event_id,
            )
            message = to_inbound(parsed, channel=channel.name, user_name=None)
            notice = too_long_notice(len(parsed.text), self._max_text)
            self._turns.decline(message, ErrorClass.BAD_REQUEST, notice)
            return web.Response(status=200)

        user_name = None
        if not parsed.is_dm:
            user_name = await channel.users.name(parsed.team_id, parsed.user_id)
        ingress_ms = (auth_started - started) * 1000 + (
            time.perf_counter() - ingress_started
        ) * 1000
        accepted = await self._turns.accept(
            to_inbound(
                parsed,
                channel=channel.name,
                user_name=user_name,
                layer_ms={"ingress": ingress_ms, "auth": auth_ms},
                received_at=request.get(REQUEST_RECEIVED_AT),
            )
        )
        log.info(
            "slack_event",
            app=channel.settings.name,
            event_id=parsed.event_id,
            turn_id=accepted.turn_id,
            duplicate=accepted.duplicate,
            retry_num=retry_num,
            retry_reason=retry_reason,
            ack_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        return web.Response(status=200)


def _pick(signed: list[SlackChannel], api_app_id: object) -> SlackChannel | None:
    """Among the apps whose secret signs the body, the one the event is for."""
    for channel in signed:
        if channel.settings.app_id is not None and channel.settings.app_id == api_app_id:
            return channel
    unbound = [c for c in signed if c.settings.app_id is None]
    return unbound[0] if unbound else None


def setup(
    app: web.Application, settings: Settings, turns: TurnService, http: aiohttp.ClientSession
) -> None:
    if not settings.slack:
        return
    channels = [SlackChannel(app_settings, http) for app_settings in settings.slack]
    for channel in channels:
        turns.register_channel(channel)
    app.router.add_post(EVENTS_PATH, SlackEvents(channels, turns, settings).handle)
