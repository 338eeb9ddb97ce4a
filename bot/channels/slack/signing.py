"""What every Slack request goes through first: the size limit, then the signature.

Events and slash commands are signed alike: slack_sdk's ``SignatureVerifier``
(HMAC-SHA256 over ``v0:{timestamp}:{raw body}``, constant-time compare,
5-minute window). A body no configured app signs gets 401 before anything
in it is parsed.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from aiohttp import web

from bot.channels.slack.channel import SlackChannel
from bot.http.body import BodyError, read_body
from bot.http.errors import json_error
from bot.turns.timing import LayerClock

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class SignedBody:
    raw: bytes
    signed_by: list[SlackChannel]
    """The configured apps whose signing secret signs ``raw``: one, unless apps share a secret."""
    auth_ms: float
    """Time spent checking signatures, for the turn's latency breakdown."""


async def read_signed_body(
    request: web.Request, channels: list[SlackChannel], max_body: int
) -> SignedBody | web.Response:
    """The raw body with the apps that signed it, or the refusal to send (413, 401)."""
    try:
        raw = await read_body(request, max_body)
    except BodyError as exc:
        return exc.response
    clock = LayerClock()
    with clock.measure("auth"):
        signed_by = _signed_by(channels, raw, request)
    if not signed_by:
        log.warning(
            "slack_signature_rejected",
            path=request.path,
            retry_num=request.headers.get("X-Slack-Retry-Num"),
        )
        return json_error(401, "auth", "missing, invalid or expired Slack signature")
    return SignedBody(raw, signed_by, clock.layer_ms["auth"])


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


def pick_app(signed_by: list[SlackChannel], api_app_id: object) -> SlackChannel | None:
    """Among the apps whose secret signs the body, the one the request is for."""
    for channel in signed_by:
        if channel.settings.app_id is not None and channel.settings.app_id == api_app_id:
            return channel
    unbound = [c for c in signed_by if c.settings.app_id is None]
    return unbound[0] if unbound else None
