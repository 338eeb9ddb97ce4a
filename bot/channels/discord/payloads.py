"""Discord's JSON -> what to do: pure functions, no I/O.

Two sources, one shape of result:

- ``parse_interaction``: a verified request to the interactions endpoint. ``PING``
  (type 1), a slash command (type 2), autocomplete (type 4), or a component or
  modal (types 3, 5: the bot sends none, so none should come). Anything not
  shaped like an interaction raises ``MalformedInteraction`` (400).
- ``parse_gateway_message``: a ``MESSAGE_CREATE`` dispatch from the gateway. A
  person's message in a DM, or in a server channel when the group policy
  answers it; anything else is ``Ignored`` with its reason.

Conversations: one per server channel or thread (a thread has a channel id of
its own) and one per DM, whether the message came as ``/ask`` or over the
gateway: ``conversation_key``. Every message of a bot is stored under the
bot's channel name as owner, so each bot is its own tenant (cache salt).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from bot.channels.access import GroupPolicy
from bot.turns.inbound import InboundMessage

# Interaction types (Discord's "Interaction Type" table).
PING = 1
APPLICATION_COMMAND = 2
MESSAGE_COMPONENT = 3
AUTOCOMPLETE = 4
MODAL_SUBMIT = 5
# Channel types that are a DM with the bot.
DM_CHANNEL_TYPES = frozenset({1, 3})
# Message types a person writes: DEFAULT and REPLY; the rest are system notices.
USER_MESSAGE_TYPES = frozenset({0, 19})
TOKEN_MAX_CHARS = 1000
NAME_MAX_CHARS = 80

_SNOWFLAKE = re.compile(r"^[0-9]{1,20}$")
_USER_MENTION = re.compile(r"<@!?([0-9]{1,20})>")
_ROLE_MENTION = re.compile(r"<@&([0-9]{1,20})>")
_CHANNEL_MENTION = re.compile(r"<#([0-9]{1,20})>")


class MalformedInteraction(ValueError):
    """A verified body that is not shaped like an interaction (the message names no value)."""


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Place:
    """Where a message was written and who wrote it."""

    channel_id: str
    guild_id: str | None
    user_id: str
    user_name: str | None
    """The name the model sees in a server channel ("name: text"); None in a DM."""

    @property
    def is_dm(self) -> bool:
        return self.guild_id is None

    @property
    def conversation_key(self) -> str:
        return conversation_key(self.channel_id, is_dm=self.is_dm)


@dataclass(frozen=True)
class SlashCommand:
    """An application command typed by a person: ``/ask message:...``, ``/new``, ..."""

    interaction_id: str
    token: str
    """The interaction's token: the reply's webhook for 15 minutes. A secret: never logged."""
    name: str
    options: dict[str, str]
    place: Place


@dataclass(frozen=True)
class Autocomplete:
    pass


@dataclass(frozen=True)
class Unsupported:
    """A component or modal interaction: this bot sends none, so it has nothing to do."""

    kind: int


Interaction = Ping | SlashCommand | Autocomplete | Unsupported


@dataclass(frozen=True)
class Ignored:
    reason: str
    known: bool = True
    """False for a message type no table lists: worth a warning."""


@dataclass(frozen=True)
class GatewayMessage:
    """A person's message over the gateway that the bot answers (or declines)."""

    message_id: str
    text: str
    place: Place
    addressed: bool
    """A DM, a mention of the bot or a reply to it: a refusal is worth a notice."""


def conversation_key(channel_id: str, *, is_dm: bool) -> str:
    """One conversation per DM and per server channel or thread."""
    return f"dm:{channel_id}" if is_dm else f"channel:{channel_id}"


def _id(value: Any) -> str | None:
    return value if isinstance(value, str) and _SNOWFLAKE.match(value) else None


def _str(value: Any, limit: int) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def _display_name(user: dict[str, Any], member: Any) -> str | None:
    nick = member.get("nick") if isinstance(member, dict) else None
    for value in (nick, user.get("global_name"), user.get("username")):
        if isinstance(value, str) and value.strip():
            # The name goes into the prompt as "name: text"; keep it one short line.
            return " ".join(value.split())[:NAME_MAX_CHARS]
    return None


def _author(document: dict[str, Any]) -> tuple[dict[str, Any], Any] | None:
    """The user who sent an interaction: ``member.user`` in a server, ``user`` in a DM."""
    member = document.get("member")
    user = member.get("user") if isinstance(member, dict) else document.get("user")
    return (user, member) if isinstance(user, dict) else None


def parse_interaction(document: Any, *, application_id: str) -> Interaction:
    """One verified interaction body -> what it asks for."""
    if not isinstance(document, dict):
        raise MalformedInteraction("body is not a JSON object")
    kind = document.get("type")
    if kind == PING:
        return Ping()
    if document.get("application_id") != application_id:
        raise MalformedInteraction("interaction for another application")
    if kind == AUTOCOMPLETE:
        return Autocomplete()
    if kind in (MESSAGE_COMPONENT, MODAL_SUBMIT):
        return Unsupported(kind)
    if kind != APPLICATION_COMMAND:
        raise MalformedInteraction("unknown interaction type")
    interaction_id = _id(document.get("id"))
    token = _str(document.get("token"), TOKEN_MAX_CHARS)
    data = document.get("data")
    channel_id = _id(document.get("channel_id"))
    if channel_id is None and isinstance(document.get("channel"), dict):
        channel_id = _id(document["channel"].get("id"))
    author = _author(document)
    if interaction_id is None or token is None or not isinstance(data, dict):
        raise MalformedInteraction("application command without id, token or data")
    if channel_id is None or author is None or _id(author[0].get("id")) is None:
        raise MalformedInteraction("application command without channel or user")
    name = _str(data.get("name"), 32)
    if name is None:
        raise MalformedInteraction("application command without a name")
    user, member = author
    guild_id = _id(document.get("guild_id"))
    channel = document.get("channel")
    if isinstance(channel, dict) and channel.get("type") in DM_CHANNEL_TYPES:
        guild_id = None
    return SlashCommand(
        interaction_id=interaction_id,
        token=token,
        name=name.lower(),
        options=_options(data.get("options")),
        place=Place(
            channel_id=channel_id,
            guild_id=guild_id,
            user_id=user["id"],
            user_name=None if guild_id is None else _display_name(user, member),
        ),
    )


def _options(options: Any) -> dict[str, str]:
    """A command's top-level string options by name; others are not ours."""
    found: dict[str, str] = {}
    if not isinstance(options, list):
        return found
    for option in options:
        if isinstance(option, dict) and isinstance(option.get("name"), str):
            value = option.get("value")
            if isinstance(value, str):
                found[option["name"]] = value
    return found


def parse_gateway_message(
    payload: Any, *, bot_user_id: str | None, groups: GroupPolicy
) -> GatewayMessage | Ignored:
    """One ``MESSAGE_CREATE`` payload (the dispatch's ``d``) -> a message to answer, or why not."""
    if not isinstance(payload, dict):
        return Ignored("not an object", known=False)
    author = payload.get("author")
    if not isinstance(author, dict) or _id(author.get("id")) is None:
        return Ignored("no author", known=False)
    # Loop prevention: anything written by a bot or a webhook (ours included) is never answered.
    if author.get("bot") or author.get("system") or payload.get("webhook_id"):
        return Ignored("bot or webhook message")
    if bot_user_id is not None and author["id"] == bot_user_id:
        return Ignored("our own message")
    if payload.get("type", 0) not in USER_MESSAGE_TYPES:
        return Ignored("system message")
    message_id = _id(payload.get("id"))
    channel_id = _id(payload.get("channel_id"))
    if message_id is None or channel_id is None:
        return Ignored("message without id or channel", known=False)
    guild_id = _id(payload.get("guild_id"))
    raw = payload.get("content")
    raw = raw if isinstance(raw, str) else ""
    mentioned = bot_user_id is not None and any(
        match.group(1) == bot_user_id for match in _USER_MENTION.finditer(raw)
    )
    replied = _replies_to(payload, bot_user_id)
    addressed = guild_id is None or mentioned or replied
    if guild_id is not None and not addressed and groups != "all":
        return Ignored("server message not addressed to the bot")
    text = clean_text(raw, bot_user_id=bot_user_id, mentions=payload.get("mentions"))
    if not text:
        return Ignored("no text (the Message Content intent may be off)")
    return GatewayMessage(
        message_id=message_id,
        text=text,
        place=Place(
            channel_id=channel_id,
            guild_id=guild_id,
            user_id=author["id"],
            user_name=None if guild_id is None else _display_name(author, payload.get("member")),
        ),
        addressed=addressed,
    )


def _replies_to(payload: dict[str, Any], bot_user_id: str | None) -> bool:
    referenced = payload.get("referenced_message")
    if bot_user_id is None or not isinstance(referenced, dict):
        return False
    author = referenced.get("author")
    return isinstance(author, dict) and author.get("id") == bot_user_id


def clean_text(raw: str, *, bot_user_id: str | None, mentions: Any = None) -> str:
    """Discord's wire text -> what the model reads: our own mention dropped (it only
    addresses the bot), other people's mentions by name where the payload names them."""
    names: dict[str, str] = {}
    for user in mentions if isinstance(mentions, list) else []:
        if isinstance(user, dict) and _id(user.get("id")) and (name := _display_name(user, None)):
            names[user["id"]] = name

    def user_mention(match: re.Match[str]) -> str:
        user_id = match.group(1)
        return "" if user_id == bot_user_id else f"@{names.get(user_id, user_id)}"

    text = _USER_MENTION.sub(user_mention, raw)
    text = _ROLE_MENTION.sub(lambda m: f"@role:{m.group(1)}", text)
    text = _CHANNEL_MENTION.sub(lambda m: f"#{m.group(1)}", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def interaction_reply_to(command: SlashCommand, *, received_at: float) -> dict[str, Any]:
    """Where a slash command's reply goes: its interaction's webhook (15 minutes from
    ``received_at``), in its channel."""
    return {
        "kind": "interaction",
        "token": command.token,
        "interaction_id": command.interaction_id,
        "channel_id": command.place.channel_id,
        "guild_id": command.place.guild_id,
        "received_at": received_at,
    }


def message_reply_to(message: GatewayMessage) -> dict[str, Any]:
    """Where a gateway message's reply goes: a message of the bot's in reply to it."""
    return {
        "kind": "message",
        "channel_id": message.place.channel_id,
        "message_id": message.message_id,
        "guild_id": message.place.guild_id,
    }


def to_inbound(
    *,
    channel: str,
    event_id: str,
    text: str,
    place: Place,
    reply_to: dict[str, Any],
    layer_ms: dict[str, float] | None = None,
    received_at: float | None = None,
    unlimited: bool = False,
) -> InboundMessage:
    """The normalised message the turn pipeline stores (the bot's channel is its owner)."""
    return InboundMessage(
        channel=channel,
        event_id=event_id,
        owner=channel,
        conversation_key=place.conversation_key,
        text=text,
        user_id=place.user_id,
        user_name=place.user_name,
        reply_to=reply_to,
        layer_ms=dict(layer_ms or {}),
        received_at=received_at if received_at is not None else time.time(),
        unlimited=unlimited,
    )


def interaction_event_id(interaction_id: str) -> str:
    return f"interaction:{interaction_id}"


def message_event_id(message_id: str) -> str:
    return f"message:{message_id}"
