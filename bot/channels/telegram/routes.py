"""``POST /telegram/{bot_name}``: verify, parse, accept, answer 200 at once.

The handler only checks the secret header (constant time; nothing is read or
stored for a request without it), parses the update, hands a message to the
turn service (which stores it deduplicated on ``update_id``) and answers.
Generation runs after the answer. Telegram sends a chat's next update only
after this answer, so a fast answer keeps chats flowing; anything but a 2xx
makes Telegram redeliver, so updates the bot does not handle still get 200.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web

from bot.channels.access import GROUPS_OFF_TEXT, NOT_ALLOWED_TEXT, REFUSAL_CLASS
from bot.channels.base import InboundMessage
from bot.channels.ids import telegram_id
from bot.channels.ingress import IngressClock, declined_too_long
from bot.channels.kind import Wiring
from bot.channels.telegram.api import TelegramApi, TelegramApiError
from bot.channels.telegram.channel import TelegramChannel
from bot.channels.telegram.commands import EDIT_REFUSED_TEXT, run_command
from bot.channels.telegram.payloads import (
    BotIdentity,
    Command,
    EditedMessage,
    Ignored,
    Overheard,
    Parsed,
    Sender,
    parse_update,
    sender_of,
)
from bot.channels.telegram.settings import TELEGRAM, TelegramBotSettings
from bot.errors import ErrorClass
from bot.http.body import BodyError, parse_json_object, read_body
from bot.http.errors import json_error
from bot.http.keys import SERVER, TURNS, USAGE
from bot.turns.branching import ForkRefused

log = structlog.get_logger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
RECENT_COMMANDS = 1024
"""Commands are not stored as turns; this many recent update ids guard them against redelivery."""
NOTICE_DRAIN_S = 5.0


@dataclass
class TelegramBot:
    """One configured bot at run time."""

    settings: TelegramBotSettings
    api: TelegramApi
    identity: BotIdentity | None = None
    recent_commands: OrderedDict[int, None] = field(default_factory=OrderedDict)
    notices: set[asyncio.Task[None]] = field(default_factory=set)
    _identity_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def resolve_identity(self) -> BotIdentity:
        """The bot's id and @username: from the config, else one ``getMe``, then cached."""
        async with self._identity_lock:  # a burst of group updates makes one getMe, not many
            return await self._resolve_identity()

    async def _resolve_identity(self) -> BotIdentity:
        if self.identity is None:
            username = self.settings.username
            bot_id = self.settings.bot_id
            if username is None or bot_id is None:
                me = await self.api.call("getMe")
                username, bot_id = str(me["username"]), int(me["id"])
            self.identity = BotIdentity(id=bot_id, username=username)
        return self.identity

    def remember_command(self, update_id: int) -> None:
        """Record a command carried out (only then: a failed one must run on redelivery)."""
        self.recent_commands[update_id] = None
        while len(self.recent_commands) > RECENT_COMMANDS:
            self.recent_commands.popitem(last=False)

    def send_notice(self, command: Command, text: str) -> None:
        """Send a command's notice after the webhook has answered."""
        params: dict[str, Any] = {"chat_id": command.reply_to["chat_id"], "text": text}
        if command.reply_to.get("message_thread_id") is not None:
            params["message_thread_id"] = command.reply_to["message_thread_id"]
        if command.reply_to.get("chat_type") != "private":
            params["reply_parameters"] = {
                "message_id": command.reply_to["message_id"],
                "allow_sending_without_reply": True,
            }

        async def send() -> None:
            try:
                await self.api.call("sendMessage", params, retry=True)
            except TelegramApiError as exc:
                log.warning(
                    "telegram_notice_undelivered",
                    bot=self.settings.name,
                    error_class=exc.error_class.value,
                    error=str(exc),
                )

        # Keep a reference: a task nobody holds may be collected mid-run.
        task = asyncio.create_task(send())
        self.notices.add(task)
        task.add_done_callback(self.notices.discard)


TELEGRAM_BOTS = web.AppKey("telegram_bots", dict[str, TelegramBot])


def _secret_ok(request: web.Request, bot: TelegramBot) -> bool:
    expected = bot.settings.secret_token
    if expected is None:
        return False  # no webhook registered with a secret yet: accept nothing
    given = request.headers.get(SECRET_HEADER, "")
    return hmac.compare_digest(given.encode(), expected.get_secret_value().encode())


def _refusal(
    settings: TelegramBotSettings, parsed: Command | InboundMessage, sender: Sender
) -> str | None:
    """Why this bot does not answer this message or command, if it does not."""
    if parsed.reply_to.get("chat_type") != "private" and settings.groups == "off":
        return GROUPS_OFF_TEXT
    if not settings.may_talk(sender.user_id, sender.username):
        return NOT_ALLOWED_TEXT
    return None


def _peek_chat_type(update: dict[str, Any]) -> str | None:
    for key in ("message", "edited_message"):
        message = update.get(key)
        if isinstance(message, dict):
            chat = message.get("chat")
            if isinstance(chat, dict):
                return str(chat.get("type"))
    return None


async def post_update(request: web.Request) -> web.Response:
    clock = IngressClock(request)
    bot = request.app[TELEGRAM_BOTS].get(request.match_info["bot_name"])
    if bot is None:
        return json_error(404, "not_found", "no such Telegram bot")
    with clock.measure("auth"):
        secret_ok = _secret_ok(request, bot)
    if not secret_ok:
        log.warning("telegram_bad_secret", bot=bot.settings.name)
        return json_error(401, "auth", f"missing or wrong {SECRET_HEADER}")
    read = await _read_update(request, bot)
    if isinstance(read, web.Response):
        return read
    update_id, update, parsed = read
    log_fields = {"bot": bot.settings.name, "update_id": update_id}
    if isinstance(parsed, Ignored):
        if parsed.known:
            log.info(
                "telegram_ignored",
                update_type=parsed.update_type,
                reason=parsed.reason,
                **log_fields,
            )
        else:
            log.warning("telegram_unknown_update", update_type=parsed.update_type, **log_fields)
        return web.Response(status=200)
    sender = sender_of(update)
    if isinstance(parsed, Overheard):
        if not bot.settings.may_talk(sender.user_id, sender.username):
            # Group chatter not meant for the bot: a notice to each line would be spam.
            log.info("telegram_ignored", update_type="message", reason="not allowed", **log_fields)
            return web.Response(status=200)
        parsed = parsed.message
    edited: dict[str, Any] | None = None
    if isinstance(parsed, EditedMessage):
        edited = parsed.edited
        parsed = parsed.message
    refusal = _refusal(bot.settings, parsed, sender)
    if refusal is not None:
        log.info("telegram_refused", reason=refusal, **log_fields)
        if isinstance(parsed, Command):
            if update_id not in bot.recent_commands:
                bot.remember_command(update_id)
                bot.send_notice(parsed, refusal)
        else:
            request.app[TURNS].decline(parsed, REFUSAL_CLASS, refusal)
    elif isinstance(parsed, Command):
        if update_id not in bot.recent_commands:
            await _run_command(request, bot, parsed, sender, log_fields)
    else:
        await _accept(request, bot, clock, parsed, edited, sender, log_fields)
    return web.Response(status=200)


async def _read_update(
    request: web.Request, bot: TelegramBot
) -> tuple[int, dict[str, Any], Parsed] | web.Response:
    """The update's id, the update and what it carries; or the refusal (413/408 for the
    body, 400 for bad JSON or no ``update_id``, 503 while the bot's @username is unknown)."""
    try:
        update = parse_json_object(await read_body(request, request.app[SERVER].max_body_bytes))
    except BodyError as exc:
        return exc.response
    update_id = telegram_id(update.get("update_id"))
    if update_id is None:
        # Without it the update cannot be deduplicated; Telegram sends none like it.
        return json_error(400, "bad_request", "update_id must be an integer of at most 64 bits")

    # Group rules need the bot's @username; private chats never wait for it.
    identity = BotIdentity(id=bot.settings.bot_id, username=bot.settings.username)
    if _peek_chat_type(update) in ("group", "supergroup"):
        try:
            identity = await bot.resolve_identity()
        except TelegramApiError as exc:
            # Not acknowledged: Telegram redelivers it once getMe works again.
            log.warning("telegram_identity_unavailable", bot=bot.settings.name, error=str(exc))
            return json_error(503, "unavailable", "cannot look up the bot's username")
    parsed = parse_update(
        update, bot=identity, channel=bot.settings.channel, groups=bot.settings.groups
    )
    return update_id, update, parsed


async def _run_command(
    request: web.Request,
    bot: TelegramBot,
    command: Command,
    sender: Sender,
    log_fields: dict[str, Any],
) -> None:
    notice = await run_command(
        command,
        channel=bot.settings.channel,
        turns=request.app[TURNS],
        usage=request.app[USAGE],
        # Admins are listed by id or @username (``TelegramBotSettings.admins``).
        is_admin=lambda user_id: bot.settings.is_admin(user_id, sender.username),
    )
    bot.remember_command(log_fields["update_id"])
    log.info("telegram_command", command=command.name, **log_fields)
    if notice is not None:
        bot.send_notice(command, notice)


async def _accept(
    request: web.Request,
    bot: TelegramBot,
    clock: IngressClock,
    parsed: InboundMessage,
    edited: dict[str, Any] | None,
    sender: Sender,
    log_fields: dict[str, Any],
) -> None:
    """Hand a message (or the edit of one) to the turn service, or decline it in the chat."""
    turns = request.app[TURNS]
    if declined_too_long(turns, parsed, request.app[SERVER].max_text_chars):
        log.info("telegram_declined", reason="text too long", **log_fields)
        return
    message = dataclasses.replace(
        parsed,
        layer_ms=clock.first_layers(),
        received_at=clock.received_at,
        unlimited=bot.settings.is_admin(sender.user_id, sender.username),
    )
    if edited is None:
        accepted = await turns.accept(message)
    else:
        try:
            accepted = await turns.accept_edit(message, edited)
        except ForkRefused:
            log.info("telegram_declined", reason="edit of an older message", **log_fields)
            turns.decline(message, ErrorClass.BAD_REQUEST, EDIT_REFUSED_TEXT)
            return
    log.info(
        "telegram_accepted", turn_id=accepted.turn_id, duplicate=accepted.duplicate, **log_fields
    )


def setup(app: web.Application, tables: list[TelegramBotSettings], wiring: Wiring) -> None:
    channels = TELEGRAM.register(
        tables,
        wiring,
        lambda table: TelegramChannel(table, TelegramApi.from_settings(wiring.http, table)),
    )
    bots = {bot.settings.name: TelegramBot(bot.settings, bot.api) for bot in channels}
    for bot in channels:
        if bot.settings.secret_token is None:
            log.warning(
                "telegram_no_secret",
                bot=bot.settings.name,
                hint="run `botctl telegram set-webhook` and set secret_token",
            )
    app[TELEGRAM_BOTS] = bots
    app.router.add_post("/telegram/{bot_name}", post_update)

    async def drain_notices(app: web.Application) -> AsyncIterator[None]:
        yield
        # Runs before the shared HTTP client closes (cleanup runs in reverse order).
        pending = [task for bot in bots.values() for task in bot.notices]
        if pending:
            await asyncio.wait(pending, timeout=NOTICE_DRAIN_S)

    app.cleanup_ctx.append(drain_notices)
