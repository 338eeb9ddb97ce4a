"""A Telegram update -> a user message, a command, or an explicit ignore.

One table of update types: ``message`` and ``edited_message`` are read, the
types in ``IGNORED_UPDATE_TYPES`` are acknowledged and ignored by name, and
anything else is ignored loudly (logged as unknown) but still acknowledged,
because a non-2xx answer only makes Telegram redeliver it for hours.

Conversations: one per private chat, one per group, one per forum topic
(``message_thread_id`` of a message with ``is_topic_message``; in a plain
supergroup a reply thread also carries a ``message_thread_id``, and stays in
the group's one conversation).

Groups: by default (``groups = "mention"``) the bot answers only when
addressed, as Telegram bots do: an ``@username`` mention (or a
``text_mention`` of the bot), a reply to one of its messages, or one of its
commands (``/new`` or ``/new@username``; a command for another bot is
ignored). The mention is cut from the text, and the turn carries the sender's
name so the model knows who speaks. With ``groups = "all"`` a message not
addressed to the bot is ``Overheard``: answered too, but never refused with a
notice (the access check in ``routes`` ignores it quietly instead).

Edited messages: an edit of the message the latest turn answered is an edit
in the history tree (``bot.turns.branching``): the corrected text is answered
from the history before the old message, on a new branch, and the old reply
stays stored. An edit of an older message gets a short notice (the turns
after it answered the old text); an edit of a message no turn was made of
(a group message that now mentions the bot) is a new message; an edit that
is not addressed (or is a command) is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from bot.channels.access import GroupPolicy
from bot.channels.base import InboundMessage
from bot.channels.ids import clip_name, telegram_id

HANDLED_UPDATE_TYPES = ("message", "edited_message")
"""What ``setWebhook`` asks for (``allowed_updates``)."""

IGNORED_UPDATE_TYPES = frozenset(
    {
        "channel_post",
        "edited_channel_post",
        "business_connection",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "message_reaction",
        "message_reaction_count",
        "inline_query",
        "chosen_inline_result",
        "callback_query",
        "shipping_query",
        "pre_checkout_query",
        "purchased_paid_media",
        "poll",
        "poll_answer",
        "my_chat_member",
        "chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    }
)

CommandName = Literal["start", "help", "new", "stop", "retry", "stats", "mode", "unknown"]
COMMANDS: frozenset[str] = frozenset({"start", "help", "new", "stop", "retry", "stats", "mode"})


@dataclass(frozen=True)
class BotIdentity:
    id: int | None
    username: str | None
    """Without the ``@``; compared case-insensitively, as Telegram usernames are."""


@dataclass(frozen=True)
class Ignored:
    update_type: str
    reason: str
    known: bool = True
    """False for an update type this module has never heard of (logged as a warning)."""


@dataclass(frozen=True)
class Command:
    name: CommandName
    args: str
    event_id: str
    conversation_key: str
    reply_to: dict[str, Any]
    user_id: str | None


@dataclass(frozen=True)
class EditedMessage:
    """An edited message: ``message`` carries the new text, ``edited`` names the old one."""

    message: InboundMessage
    edited: dict[str, Any]
    """The address the turn of the original message stores in ``reply_to``."""


@dataclass(frozen=True)
class Overheard:
    """A group message not addressed to the bot, taken because the bot answers every one."""

    message: InboundMessage


@dataclass(frozen=True)
class Sender:
    user_id: str | None
    username: str | None
    """Without the ``@``, as Telegram sends it."""


Parsed = InboundMessage | Command | Overheard | Ignored | EditedMessage


def _utf16_slice(text: str, offset: int, length: int) -> tuple[int, int]:
    """Code-point bounds of an entity given in UTF-16 units, as Telegram gives them."""
    units = 0
    start = end = len(text)
    for index, char in enumerate(text):
        if units == offset:
            start = index
        if units == offset + length:
            end = index
            break
        units += 2 if ord(char) > 0xFFFF else 1
    return start, end


def _display_name(message: dict[str, Any]) -> str | None:
    sender_chat = message.get("sender_chat")
    if isinstance(sender_chat, dict) and sender_chat.get("title"):
        return clip_name(str(sender_chat["title"]))  # anonymous admin or a linked channel
    user = _object(message.get("from"))
    name = " ".join(str(user[key]) for key in ("first_name", "last_name") if user.get(key))
    return clip_name(name or (str(user["username"]) if user.get("username") else None))


def _object(value: Any) -> dict[str, Any]:
    """A JSON object of the update, or an empty one where the update has something else."""
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    """An entity's offset or length as given, 0 where it is no integer."""
    return value if type(value) is int else 0


def _conversation_key(chat_id: int, thread_id: int | None) -> str:
    return f"chat:{chat_id}" if thread_id is None else f"chat:{chat_id}:topic:{thread_id}"


def sender_of(update: dict[str, Any]) -> Sender:
    """Who sent a ``message`` / ``edited_message`` update (for the allow-list)."""
    for key in HANDLED_UPDATE_TYPES:
        message = update.get(key)
        if isinstance(message, dict):
            sender = message.get("from")
            if isinstance(sender, dict):
                user_id = telegram_id(sender.get("id"))
                username = sender.get("username")
                return Sender(
                    str(user_id) if user_id is not None else None,
                    username if isinstance(username, str) and username else None,
                )
    return Sender(None, None)


def parse_update(
    update: dict[str, Any], *, bot: BotIdentity, channel: str, groups: GroupPolicy = "mention"
) -> Parsed:
    """Classify one update of the bot ``channel`` (``telegram:{name}``)."""
    update_type = next((key for key in update if key != "update_id"), "(empty)")
    if update_type in IGNORED_UPDATE_TYPES:
        return Ignored(update_type, "update type not handled")
    if update_type not in HANDLED_UPDATE_TYPES:
        return Ignored(update_type, "unknown update type", known=False)
    message = update[update_type]
    if not isinstance(message, dict):
        return Ignored(update_type, "malformed update")
    edited = update_type == "edited_message"
    chat = _object(message.get("chat"))
    chat_id, chat_type = telegram_id(chat.get("id")), chat.get("type")
    text = message.get("text")
    sender = _object(message.get("from"))
    if chat_id is None or chat_type not in ("private", "group", "supergroup"):
        return Ignored(update_type, "not a private or group chat")
    malformed = _malformed_ids(message, sender)
    if malformed is not None:
        return Ignored(update_type, malformed)
    if not isinstance(text, str) or not text.strip():
        return Ignored(update_type, "no text")
    if sender.get("is_bot") and not message.get("sender_chat"):
        return Ignored(update_type, "sent by a bot")

    thread_id = message.get("message_thread_id") if message.get("is_topic_message") else None
    reply_to: dict[str, Any] = {
        "chat_id": chat_id,
        "chat_type": chat_type,
        "message_id": message.get("message_id"),
        "message_thread_id": thread_id,
    }
    key = _conversation_key(chat_id, thread_id)
    user_id = str(sender["id"]) if "id" in sender else None
    group = chat_type != "private"
    listed = message.get("entities")
    entities = [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []

    command = _command(text, entities, bot)
    if command is not None:
        name, addressed_to, args = command
        if addressed_to is not None and addressed_to.lower() != (bot.username or "").lower():
            return Ignored(update_type, "command for another bot")
        if edited:
            return Ignored(update_type, "edited command")
        if name not in COMMANDS:
            if group:
                return Ignored(update_type, "unknown command")
            name = "unknown"
        return Command(
            cast(CommandName, name), args, str(update["update_id"]), key, reply_to, user_id
        )

    overheard = False
    if group:
        mention = _mention_of(text, entities, bot)
        if mention is None and not _replies_to_bot(message, bot):
            if groups != "all":
                return Ignored(update_type, "group message not addressed to the bot")
            overheard = True
        if mention is not None:
            start, end = mention
            trimmed = (text[:start] + text[end:]).strip()
            text = trimmed or text
    inbound = InboundMessage(
        channel=channel,
        event_id=str(update["update_id"]),
        owner=channel,
        conversation_key=key,
        text=text.strip(),
        user_id=user_id,
        user_name=_display_name(message) if group else None,
        reply_to=reply_to,
    )
    if edited:
        return EditedMessage(inbound, {"chat_id": chat_id, "message_id": reply_to["message_id"]})
    return Overheard(inbound) if overheard else inbound


def _malformed_ids(message: dict[str, Any], sender: dict[str, Any]) -> str | None:
    """Why the ids of a message Telegram could not have sent make it unusable, or None.

    Each is stored or sent back (``bot.channels.ids``): an id Telegram never makes
    (text, a float, a number past 64 bits) would fail there, after the update was
    taken on.
    """
    if telegram_id(message.get("message_id")) is None:
        return "malformed message_id"
    if message.get("is_topic_message") and telegram_id(message.get("message_thread_id")) is None:
        return "malformed message_thread_id"
    if "id" in sender and telegram_id(sender["id"]) is None:
        return "malformed sender id"
    return None


def _command(
    text: str, entities: list[dict[str, Any]], bot: BotIdentity
) -> tuple[str, str | None, str] | None:
    """(name, @bot it is addressed to or None, arguments) of a leading ``bot_command``."""
    for entity in entities:
        if entity.get("type") == "bot_command" and entity.get("offset") == 0:
            _, end = _utf16_slice(text, 0, _int(entity.get("length", 0)))
            name, _, addressed_to = text[1:end].partition("@")
            return name.lower(), addressed_to or None, text[end:].strip()
    return None


def _mention_of(
    text: str, entities: list[dict[str, Any]], bot: BotIdentity
) -> tuple[int, int] | None:
    """Code-point bounds of the first mention of the bot in ``text``."""
    for entity in entities:
        kind = entity.get("type")
        offset, length = _int(entity.get("offset", 0)), _int(entity.get("length", 0))
        start, end = _utf16_slice(text, offset, length)
        if kind == "mention" and bot.username:
            if text[start:end].lower() == f"@{bot.username.lower()}":
                return start, end
        elif kind == "text_mention" and _object(entity.get("user")).get("id") == bot.id:
            return start, end
    return None


def _replies_to_bot(message: dict[str, Any], bot: BotIdentity) -> bool:
    replied = message.get("reply_to_message")
    if not isinstance(replied, dict) or bot.id is None:
        return False
    # In a forum every message "replies" to its topic's creation message; that is no reply.
    if "forum_topic_created" in replied:
        return False
    return _object(replied.get("from")).get("id") == bot.id
