"""Events API envelopes -> a user message to answer, or an explicit reason to ignore.

Pure functions of the parsed JSON body, no I/O: the HTTP handler verifies the
signature first, then calls ``parse_body``. Every event type and message
subtype we know of has a row in the tables below; anything else is ignored
too (Slack must get its 200 either way) but logged loudly as ``unknown``.

What is answered:

- ``app_mention`` anywhere but a DM: the reply goes to the mention's thread, or
  starts one at the mention. One conversation per thread.
- ``message`` with ``channel_type == "im"`` (the ``message.im`` subscription):
  one conversation per DM.

Plain channel messages (``message.channels`` / ``message.groups`` /
``message.mpim``) are ignored on purpose: a mention arrives both as a
``message`` and as an ``app_mention`` with different event ids, so answering
both would reply twice. An app configured with ``channels = "all"`` answers
every channel message instead, and then ignores ``app_mention`` for the same
reason.
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass
from typing import Any

from bot.channels.access import GroupPolicy
from bot.channels.base import InboundMessage
from bot.channels.ids import clip_name, slack_id, slack_team_id

# Subtypes of ``message`` that are never a new user request.
IGNORED_MESSAGE_SUBTYPES: dict[str, str] = {
    "bot_message": "bot message",
    "message_changed": "edit of an earlier message",
    "message_deleted": "deletion",
    "message_replied": "thread bookkeeping",
    "thread_broadcast": "thread reply echoed to the channel",
    "channel_join": "membership change",
    "channel_leave": "membership change",
    "group_join": "membership change",
    "group_leave": "membership change",
    "channel_topic": "channel metadata",
    "channel_purpose": "channel metadata",
    "channel_name": "channel metadata",
    "channel_archive": "channel metadata",
    "channel_unarchive": "channel metadata",
    "pinned_item": "pin",
    "unpinned_item": "pin",
    "me_message": "/me status",
    "file_share": "file upload",
    "ekm_access_denied": "message hidden by EKM",
    "reminder_add": "reminder",
    "assistant_app_thread": "assistant thread bookkeeping",
}

# Event types we receive (or could, with a broader subscription) and do not answer.
IGNORED_EVENT_TYPES: dict[str, str] = {
    "app_home_opened": "home tab opened",
    "app_uninstalled": "app uninstalled",
    "tokens_revoked": "tokens revoked",
    "member_joined_channel": "membership change",
    "member_left_channel": "membership change",
    "reaction_added": "reaction",
    "reaction_removed": "reaction",
    "assistant_thread_started": "assistant thread opened",
    "assistant_thread_context_changed": "assistant thread context",
}

# Envelope types other than ``event_callback`` / ``url_verification``.
IGNORED_ENVELOPE_TYPES: dict[str, str] = {
    # Slack stopped delivering events for a while: nothing to answer, but worth a warning.
    "app_rate_limited": "Slack rate-limited event delivery to this app",
}

_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
_CHANNEL_REF = re.compile(r"<#([CG][A-Z0-9]+)(?:\|([^>]*))?>")
_SPECIAL = re.compile(r"<!(here|channel|everyone)(?:\|[^>]*)?>")
_SUBTEAM = re.compile(r"<!subteam\^[A-Z0-9]+(?:\|([^>]*))?>")
_LINK = re.compile(r"<((?:https?|mailto|tel):[^|>]+)(?:\|([^>]*))?>")


class MalformedEvent(ValueError):
    """A verified body that is not a well-formed Events API payload."""


@dataclass(frozen=True)
class UrlVerification:
    challenge: str


@dataclass(frozen=True)
class Ignored:
    reason: str
    kind: str
    """``envelope:<type>``, ``event:<type>`` or ``message:<subtype>``, for the log line."""
    event_id: str | None = None
    unknown: bool = False
    """True for types no table lists: worth a warning, maybe a new table row."""


@dataclass(frozen=True)
class UserMessage:
    """A message from a person that the bot should answer."""

    event_id: str
    api_app_id: str | None
    team_id: str
    channel_id: str
    user_id: str
    text: str
    ts: str
    thread_ts: str | None
    """The thread the reply goes to; None only for a top-level DM message."""
    is_dm: bool
    conversation_key: str
    event_time: int | None
    addressed: bool = True
    """False for a channel message that does not mention the bot (``channels = "all"``)."""


Parsed = UrlVerification | Ignored | UserMessage


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def bot_user_ids(body: dict[str, Any]) -> set[str]:
    """Our own user ids in this workspace, from the envelope's ``authorizations``."""
    ids: set[str] = set()
    for auth in body.get("authorizations") or []:
        if isinstance(auth, dict) and auth.get("is_bot") and _str(auth.get("user_id")):
            ids.add(auth["user_id"])
    return ids


def clean_text(text: str, *, bot_user_ids: set[str]) -> str:
    """Slack's wire format -> the plain text the model sees.

    Our own mention is dropped (it only addresses the bot), other references
    keep their readable part, and ``&amp; &lt; &gt;`` are unescaped last so
    that escaped brackets never look like references.
    """

    def mention(match: re.Match[str]) -> str:
        return "" if match.group(1) in bot_user_ids else f"@{match.group(1)}"

    text = _MENTION.sub(mention, text)
    text = _CHANNEL_REF.sub(lambda m: f"#{m.group(2) or m.group(1)}", text)
    text = _SPECIAL.sub(lambda m: f"@{m.group(1)}", text)
    text = _SUBTEAM.sub(lambda m: f"@{m.group(1) or 'group'}", text)
    text = _LINK.sub(lambda m: m.group(2) or m.group(1), text)
    text = html.unescape(text) if "&" in text else text
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def parse_body(body: Any, *, channels: GroupPolicy = "mention") -> Parsed:
    """One verified request body -> what to do with it (``channels``: the app's policy)."""
    if not isinstance(body, dict):
        raise MalformedEvent("body is not a JSON object")
    envelope_type = body.get("type")
    if envelope_type == "url_verification":
        challenge = _str(body.get("challenge"))
        if challenge is None:
            raise MalformedEvent("url_verification without challenge")
        return UrlVerification(challenge)
    if envelope_type != "event_callback":
        kind = f"envelope:{envelope_type}"
        if isinstance(envelope_type, str) and envelope_type in IGNORED_ENVELOPE_TYPES:
            return Ignored(IGNORED_ENVELOPE_TYPES[envelope_type], kind)
        return Ignored("unknown envelope type", kind, unknown=True)

    event_id = slack_id(body.get("event_id"))
    event = body.get("event")
    team_id = slack_team_id(body.get("team_id"))
    if event_id is None or not isinstance(event, dict) or team_id is None:
        # Ids of the wrong shape too: each is stored, in columns of fixed width.
        raise MalformedEvent("event_callback without a well-formed event_id, event or team_id")
    return _parse_event(body, event, event_id=event_id, team_id=team_id, channels=channels)


def _parse_event(
    body: dict[str, Any],
    event: dict[str, Any],
    *,
    event_id: str,
    team_id: str,
    channels: GroupPolicy,
) -> Parsed:
    event_type = event.get("type")
    subtype = event.get("subtype")
    if event_type not in ("app_mention", "message"):
        kind = f"event:{event_type}"
        if isinstance(event_type, str) and event_type in IGNORED_EVENT_TYPES:
            return Ignored(IGNORED_EVENT_TYPES[event_type], kind, event_id)
        return Ignored("unknown event type", kind, event_id, unknown=True)
    if subtype is not None:
        kind = f"message:{subtype}"
        if isinstance(subtype, str) and subtype in IGNORED_MESSAGE_SUBTYPES:
            return Ignored(IGNORED_MESSAGE_SUBTYPES[subtype], kind, event_id)
        return Ignored("unknown message subtype", kind, event_id, unknown=True)

    own_ids = bot_user_ids(body)
    user_id = _str(event.get("user"))
    # Loop prevention: anything written by an app (ours included) is never answered.
    if event.get("bot_id") or event.get("bot_profile") or user_id is None:
        return Ignored("bot message", f"event:{event_type}", event_id)
    if user_id in own_ids:
        return Ignored("our own message", f"event:{event_type}", event_id)

    if slack_id(user_id) is None:
        raise MalformedEvent(f"{event_type} with a malformed user")
    channel_id = slack_id(event.get("channel"))
    ts = slack_id(event.get("ts"))
    if channel_id is None or ts is None:
        raise MalformedEvent(f"{event_type} without a well-formed channel or ts")
    thread_ts = _str(event.get("thread_ts"))
    if thread_ts is not None and slack_id(thread_ts) is None:
        raise MalformedEvent(f"{event_type} with a malformed thread_ts")
    channel_type = event.get("channel_type")
    is_dm = channel_type == "im"

    every_message = channels == "all"
    if event_type == "message" and not is_dm and not every_message:
        return Ignored(
            "channel message: mentions arrive as app_mention", f"message:{channel_type}", event_id
        )
    if event_type == "app_mention" and not is_dm and every_message:
        return Ignored(
            "mention: every channel message arrives as message", "event:app_mention", event_id
        )
    if event_type == "app_mention" and is_dm:
        # Slack does not send these; if it ever does, message.im already covers DMs.
        return Ignored("mention in a DM: message.im covers it", "event:app_mention", event_id)

    raw_text = _str(event.get("text")) or ""
    mentioned = any(match.group(1) in own_ids for match in _MENTION.finditer(raw_text))
    text = clean_text(raw_text, bot_user_ids=own_ids)
    if not text:
        return Ignored("no text left once the mention is removed", f"event:{event_type}", event_id)

    if is_dm:
        conversation_key = dm_conversation_key(channel_id)
        reply_thread = thread_ts
    else:
        reply_thread = thread_ts or ts
        conversation_key = f"{channel_id}:thread:{reply_thread}"
    event_time = body.get("event_time")
    return UserMessage(
        event_id=event_id,
        api_app_id=_str(body.get("api_app_id")),
        team_id=team_id,
        channel_id=channel_id,
        user_id=user_id,
        text=text,
        ts=ts,
        thread_ts=reply_thread,
        is_dm=is_dm,
        conversation_key=conversation_key,
        event_time=event_time if isinstance(event_time, int) else None,
        addressed=is_dm or event_type == "app_mention" or mentioned,
    )


def dm_conversation_key(channel_id: str) -> str:
    """The one conversation of a DM; slash commands address it with this key too."""
    return f"im:{channel_id}"


def to_inbound(
    msg: UserMessage,
    *,
    channel: str,
    user_name: str | None,
    layer_ms: dict[str, float] | None = None,
    received_at: float | None = None,
    unlimited: bool = False,
) -> InboundMessage:
    """The normalised message the turn pipeline stores; ``reply_to`` is what the sink needs."""
    return InboundMessage(
        channel=channel,
        event_id=msg.event_id,
        owner=msg.team_id,
        conversation_key=msg.conversation_key,
        text=msg.text,
        user_id=msg.user_id,
        # In a DM there is one speaker: a name prefix would only cost tokens.
        user_name=None if msg.is_dm else clip_name(user_name or msg.user_id),
        reply_to={
            "team_id": msg.team_id,
            "channel_id": msg.channel_id,
            "thread_ts": msg.thread_ts,
            "message_ts": msg.ts,
            "user_id": msg.user_id,
            "is_dm": msg.is_dm,
        },
        layer_ms=dict(layer_ms or {}),
        received_at=received_at if received_at is not None else time.time(),
        unlimited=unlimited,
    )
