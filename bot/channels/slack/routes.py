"""``POST /slack/events``: verify, parse, persist, acknowledge. Generation runs after the 200.

1. Read the raw body (size-limited) and find the app whose signing secret
   signs it (``signing.py``). No match: 401, nothing parsed, nothing stored.
2. ``url_verification``: echo the challenge.
3. Ignored events (bots, edits, other subtypes...): 200, nothing stored.
4. A user message: ``TurnService.accept`` stores it deduplicated on
   ``(channel, event_id)`` with its queued turn, and the 200 goes out. A
   Slack retry (``X-Slack-Retry-Num``) of an event already stored is a
   duplicate and is only acknowledged; a retry whose first delivery never
   reached us is stored and answered like a first delivery.

A 5xx (e.g. the database is down) makes Slack retry later, which is what we want.

``POST /slack/commands``: the ``/new``, ``/stop`` and ``/mode`` slash commands
(``commands.py``), verified the same way and answered in the 200 itself.

Who may talk (``bot.channels.access``): a message or command from someone the
app's ``allowed_users`` leaves out, or a channel message under ``channels =
"off"``, is answered with a short notice and nothing is stored.
"""

from __future__ import annotations

from urllib.parse import parse_qs

import structlog
from aiohttp import web

from bot.channels.access import GROUPS_OFF_TEXT, NOT_ALLOWED_TEXT, REFUSAL_CLASS
from bot.channels.ingress import IngressClock, declined_too_long, too_long
from bot.channels.kind import Wiring
from bot.channels.slack.channel import SlackChannel
from bot.channels.slack.commands import (
    HELP_TEXT,
    OTHER_APP_TEXT,
    MalformedCommand,
    parse_form,
    run_command,
)
from bot.channels.slack.payloads import (
    Ignored,
    MalformedEvent,
    UrlVerification,
    UserMessage,
    parse_body,
    to_inbound,
)
from bot.channels.slack.settings import SLACK, SlackAppSettings
from bot.channels.slack.signing import SignedBody, pick_app, read_signed_body
from bot.http.body import BodyError, load_json, read_body
from bot.http.errors import json_error
from bot.http.keys import USAGE

log = structlog.get_logger(__name__)

EVENTS_PATH = "/slack/events"
COMMANDS_PATH = "/slack/commands"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


class SlackRoutes:
    """The two request handlers, holding the configured apps."""

    def __init__(self, channels: list[SlackChannel], wiring: Wiring) -> None:
        self._channels = channels
        self._turns = wiring.turns
        self._server = wiring.server

    async def events(self, request: web.Request) -> web.StreamResponse:
        clock = IngressClock(request)
        retry_num = request.headers.get("X-Slack-Retry-Num")
        signed = await read_signed_body(request, self._channels, self._server.max_body_bytes)
        if not isinstance(signed, SignedBody):
            return signed
        clock.add("auth", signed.auth_ms)
        try:
            document = load_json(signed.raw)
            app = pick_app(signed.signed_by, _app_id(document))
            parsed = parse_body(document, channels=app.settings.channels if app else "mention")
        except (BodyError, MalformedEvent) as exc:
            log.warning("slack_event_malformed", error=str(exc))
            return json_error(400, "bad_request", "not an Events API payload")
        if isinstance(parsed, UrlVerification):
            # Carries no api_app_id; a valid signature is all Slack asks us to prove.
            return web.json_response({"challenge": parsed.challenge})
        channel = app
        if channel is None:
            log.warning("slack_event_for_another_app", api_app_id=document.get("api_app_id"))
        elif isinstance(parsed, Ignored):
            _log_ignored(channel, parsed, retry_num, warn=parsed.unknown)
        elif self._admitted(channel, parsed, retry_num):
            await self._accept(request, clock, channel, parsed)
        return web.Response(status=200)

    def _admitted(self, channel: SlackChannel, parsed: UserMessage, retry_num: str | None) -> bool:
        """False when the app does not answer this message: declined (in the chat, when it
        was addressed to the bot) or over the length limit."""
        refusal = _refusal(channel.settings, parsed)
        if refusal is not None:
            log.info(
                "slack_event_refused",
                app=channel.settings.name,
                event_id=parsed.event_id,
                reason=refusal,
                addressed=parsed.addressed,
            )
            if parsed.addressed:
                # Channel chatter not meant for the bot gets no notice: that would be spam.
                message = to_inbound(parsed, channel=channel.name, user_name=None)
                self._turns.decline(message, REFUSAL_CLASS, refusal)
            return False
        unnamed = to_inbound(parsed, channel=channel.name, user_name=None)
        if declined_too_long(self._turns, unnamed, self._server.max_text_chars):
            reason = too_long(parsed.text, self._server.max_text_chars) or ""
            _log_ignored(
                channel, Ignored(reason, "too_long", parsed.event_id), retry_num, warn=True
            )
            return False
        return True

    async def _accept(
        self, request: web.Request, clock: IngressClock, channel: SlackChannel, parsed: UserMessage
    ) -> None:
        user_name = None
        if not parsed.is_dm:
            user_name = await channel.users.name(parsed.team_id, parsed.user_id)
        accepted = await self._turns.accept(
            to_inbound(
                parsed,
                channel=channel.name,
                user_name=user_name,
                layer_ms=clock.first_layers(),
                received_at=clock.received_at,
                unlimited=channel.settings.is_admin(parsed.user_id),
            )
        )
        log.info(
            "slack_event",
            app=channel.settings.name,
            event_id=parsed.event_id,
            turn_id=accepted.turn_id,
            duplicate=accepted.duplicate,
            retry_num=request.headers.get("X-Slack-Retry-Num"),
            retry_reason=request.headers.get("X-Slack-Retry-Reason"),
            ack_ms=round(clock.elapsed_ms(), 3),
        )

    async def commands(self, request: web.Request) -> web.StreamResponse:
        """``POST /slack/commands``: the slash commands, answered to their user alone.

        Slack shows any non-200 answer to a command as a bare failure, so whatever
        a person can type (an unknown command, a form missing a field) gets a 200
        with the help text. A signed body that is no form at all cannot come from
        typing a command: it means another Slack feature (e.g. the Events API
        Request URL, whose check is JSON) points here, and the 400 makes Slack's
        URL check fail where the admin is looking.
        """
        if await _is_ssl_check(request, self._server.max_body_bytes):
            return web.Response(status=200)
        signed = await read_signed_body(request, self._channels, self._server.max_body_bytes)
        if not isinstance(signed, SignedBody):
            return signed
        if request.content_type != FORM_CONTENT_TYPE:
            log.warning("slack_command_malformed", content_type=request.content_type)
            return json_error(400, "bad_request", f"a slash command is {FORM_CONTENT_TYPE}")
        try:
            # read_signed_body only lets UTF-8 through: the signature is over its text.
            command = parse_form(signed.raw.decode())
        except MalformedCommand as exc:
            log.warning("slack_command_malformed", error=str(exc))
            return _ephemeral(HELP_TEXT)
        channel = pick_app(signed.signed_by, command.api_app_id)
        if channel is None:
            log.warning("slack_command_for_another_app", api_app_id=command.api_app_id)
            return _ephemeral(OTHER_APP_TEXT)
        if channel.settings.may_talk(command.user_id):
            answer = await run_command(
                command,
                channel=channel.name,
                turns=self._turns,
                usage=request.app[USAGE],
                is_admin=channel.settings.is_admin,
            )
        else:
            answer = NOT_ALLOWED_TEXT
        log.info(
            "slack_command",
            app=channel.settings.name,
            command=command.typed,
            team_id=command.team_id,
            channel_id=command.channel_id,
            user_id=command.user_id,
            answer=answer.splitlines()[0],
        )
        return _ephemeral(answer)


def _log_ignored(
    channel: SlackChannel, ignored: Ignored, retry_num: str | None, *, warn: bool
) -> None:
    emit = log.warning if warn else log.info
    emit(
        "slack_event_ignored",
        app=channel.settings.name,
        kind=ignored.kind,
        reason=ignored.reason,
        event_id=ignored.event_id,
        retry_num=retry_num,
    )


def _app_id(document: object) -> str | None:
    value = document.get("api_app_id") if isinstance(document, dict) else None
    return value if isinstance(value, str) else None


def _refusal(settings: SlackAppSettings, message: UserMessage) -> str | None:
    """Why this app does not answer this message, if it does not."""
    if not message.is_dm and settings.channels == "off":
        return GROUPS_OFF_TEXT
    if not settings.may_talk(message.user_id):
        return NOT_ALLOWED_TEXT
    return None


async def _is_ssl_check(request: web.Request, max_body: int) -> bool:
    """Slack's periodic check of a command's Request URL (``ssl_check=1``, no command).

    It carries nothing to act on and, as Slack's own Bolt framework assumes, may
    come unsigned: it is answered 200 before the signature check, and nothing
    else is done with it.
    """
    if request.content_type != FORM_CONTENT_TYPE:
        return False
    try:
        raw = await read_body(request, max_body)  # aiohttp keeps it for the next read
    except BodyError:
        return False
    fields = parse_qs(raw.decode("utf-8", errors="replace"))
    return fields.get("ssl_check") == ["1"] and "command" not in fields


def _ephemeral(text: str) -> web.Response:
    """A slash command's answer, shown only to the user who typed the command."""
    return web.json_response({"response_type": "ephemeral", "text": text})


def setup(app: web.Application, tables: list[SlackAppSettings], wiring: Wiring) -> None:
    channels = SLACK.register(tables, wiring, lambda table: SlackChannel(table, wiring.http))
    if channels:
        routes = SlackRoutes(channels, wiring)
        app.router.add_post(EVENTS_PATH, routes.events)
        app.router.add_post(COMMANDS_PATH, routes.commands)
