"""Telegram Bot API methods as the fake (``bot.testing.telegram_api``) knows them: the
parameters each takes, how a call's parameters and text are read, Telegram's refusals
in its own wording, and the objects (users, chats, messages) it answers with.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bot.testing.telegram_html import Entity, EntityParseError, parse_html, plain, utf16_len

MAX_TEXT = 4096
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
COUNTED = frozenset({"sendMessage", "editMessageText", "sendMessageDraft"})
"""Calls that count against a chat's flood limit."""

_COMMON_SEND = {
    "business_connection_id",
    "disable_notification",
    "protect_content",
    "allow_paid_broadcast",
    "message_effect_id",
    "reply_markup",
    "direct_messages_topic_id",
    "suggested_post_parameters",
}

# method -> (required, optional) parameter names.
SIGNATURES: dict[str, tuple[set[str], set[str]]] = {
    "getMe": (set(), set()),
    "sendMessage": (
        {"chat_id", "text"},
        {
            "message_thread_id",
            "parse_mode",
            "entities",
            "link_preview_options",
            "reply_parameters",
            "reply_to_message_id",
            *_COMMON_SEND,
        },
    ),
    "editMessageText": (
        {"text"},
        {
            "chat_id",
            "message_id",
            "inline_message_id",
            "parse_mode",
            "entities",
            "link_preview_options",
            "reply_markup",
            "business_connection_id",
        },
    ),
    "sendMessageDraft": (
        {"chat_id", "draft_id", "text"},
        {"message_thread_id", "parse_mode", "entities"},
    ),
    "sendChatAction": (
        {"chat_id", "action"},
        {"message_thread_id", "business_connection_id"},
    ),
    "setWebhook": (
        {"url"},
        {
            "certificate",
            "ip_address",
            "max_connections",
            "allowed_updates",
            "drop_pending_updates",
            "secret_token",
        },
    ),
    "getWebhookInfo": (set(), set()),
    "deleteWebhook": (set(), {"drop_pending_updates"}),
}

MISSING = {
    "chat_id": "chat_id is empty",
    "text": "message text is empty",
    "action": "action is empty",
    "url": "url is empty",
    "draft_id": "fake: draft_id is required",
}


class ApiRefusal(Exception):
    def __init__(self, error_code: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.error_code = error_code
        self.description = description
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": self.error_code,
            "description": self.description,
        }
        if self.retry_after is not None:
            body["parameters"] = {"retry_after": self.retry_after}
        return body


def bad(description: str) -> ApiRefusal:
    return ApiRefusal(400, f"Bad Request: {description}")


@dataclass
class FakeBot:
    token: str
    id: int
    username: str
    first_name: str = "Test Bot"
    revoked: bool = False
    webhook_url: str = ""
    webhook_secret: str | None = None
    allowed_updates: list[str] | None = None
    pending_update_count: int = 0
    last_error_message: str | None = None

    def user(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "is_bot": True,
            "first_name": self.first_name,
            "username": self.username,
        }


@dataclass
class StoredMessage:
    message_id: int
    chat_id: int
    text: str
    entities: list[Entity]
    source: str
    parse_mode: str | None
    message_thread_id: int | None = None
    reply_to_message_id: int | None = None
    edits: int = 0


@dataclass
class RecordedCall:
    bot: str
    method: str
    params: dict[str, Any]
    at: float
    ok: bool = True
    error_code: int | None = None
    description: str | None = None

    @property
    def chat_id(self) -> Any:
        return self.params.get("chat_id")


def chat_json(chat_id: int) -> dict[str, Any]:
    if chat_id > 0:
        return {"id": chat_id, "first_name": "User", "type": "private"}
    kind = "supergroup" if str(chat_id).startswith("-100") else "group"
    return {"id": chat_id, "title": "Group", "type": kind}


def read_text(params: dict[str, Any]) -> tuple[str, list[Entity], str | None]:
    source = params.get("text")
    if not isinstance(source, str):
        raise bad("message text is empty")
    parse_mode = params.get("parse_mode")
    if "entities" in params:
        raise bad("fake: explicit entities are not supported by this fake")
    if parse_mode is None:
        text, entities = plain(source)
    elif str(parse_mode).lower() == "html":
        try:
            text, entities = parse_html(source)
        except EntityParseError as exc:
            raise bad(f"can't parse entities: {exc}") from None
    else:
        raise bad(f"fake: parse_mode {parse_mode!r} is not implemented by this fake")
    if not text:
        raise bad("message text is empty")
    if utf16_len(text) > MAX_TEXT:
        raise bad("message is too long")
    return text, entities, parse_mode


def message_thread(params: dict[str, Any]) -> int | None:
    thread = params.get("message_thread_id")
    if thread is not None and not isinstance(thread, int):
        raise bad("fake: message_thread_id must be an integer")
    return thread


def message_json(bot: FakeBot, message: StoredMessage) -> dict[str, Any]:
    body: dict[str, Any] = {
        "message_id": message.message_id,
        "from": bot.user(),
        "chat": chat_json(message.chat_id),
        "date": int(time.time()),
        "text": message.text,
    }
    if message.entities:
        body["entities"] = [entity.to_json() for entity in message.entities]
    if message.message_thread_id is not None:
        body["message_thread_id"] = message.message_thread_id
        body["is_topic_message"] = True
    if message.edits:
        body["edit_date"] = int(time.time())
    return body


async def read_params(request: web.Request) -> dict[str, Any]:
    """Telegram takes JSON, form fields or the query string; form values may hold JSON."""
    params: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        body = await request.json()
        if not isinstance(body, dict):
            return params
        params.update(body)
        return params
    if request.can_read_body:
        form = await request.post()
        params.update({key: value for key, value in form.items() if isinstance(value, str)})
    for key, value in list(params.items()):
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                params[key] = json.loads(value)
    return params
