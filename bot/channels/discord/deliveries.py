"""The two places a reply is written on Discord, each moved to show a given text.

``push(text, final=...)`` takes the cumulative reply and makes only the calls
needed to go from what Discord shows now to ``text``, recording each success at
once, so a push cut short by an error can simply be repeated.

- ``InteractionDelivery`` (``/ask``): the deferred response's "thinking…" message
  (``@original``) is edited as the reply grows; past ``max_message_chars`` the
  reply goes on in follow-up messages of the same interaction, each edited in
  turn. All through the interaction's webhook, whose token Discord accepts for
  15 minutes after the interaction: no call is made after that.
- ``ChannelDelivery`` (the gateway's mentions and DMs): a message of the bot's,
  in reply to the user's, edited as the reply grows; past the limit, a new
  message in the channel.

Every message goes with ``allowed_mentions`` parsing nothing: whatever the
model writes, nobody is pinged.

``state()`` is where a delivery stands (the message being written, how much of
the reply the messages before it hold), JSON for ``delivery_state``; ``restore``
takes a dead worker's, so the worker taking the turn over edits that message on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from bot.channels.discord.api import UNKNOWN_WEBHOOK, Call, DiscordApi, DiscordCallError, token_key
from bot.channels.discord.render import render
from bot.channels.discord.settings import MAX_MESSAGE_CHARS
from bot.channels.slack import splitting

INTERACTION_TOKEN_LIFETIME_S = 15 * 60.0
"""Discord accepts an interaction's token for 15 minutes after the interaction."""
TOKEN_MARGIN_S = 10.0
"""No call this close to the token's end: one that lands after it would be refused."""
ACK_GRACE_S = 5.0
"""How long after the interaction ``@original`` may still be unknown to Discord: the turn
can start before Discord has read the deferred response the handler sent."""
ACK_RETRY_S = 0.25
NO_MENTIONS: dict[str, Any] = {"parse": []}
EMPTY_REPLY_TEXT = "*(no reply)*"


class TokenExpired(Exception):
    """The interaction's token is past its 15 minutes: nothing more can be sent with it."""


class Delivery(Protocol):
    def next_delay(self) -> float: ...

    async def push(self, text: str, *, final: bool) -> None: ...

    async def apologise(self, message: str) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


def _content(text: str) -> dict[str, Any]:
    return {"content": text, "allowed_mentions": NO_MENTIONS}


def first_piece(rest: str, limit: int) -> tuple[str, splitting.Cut | None]:
    """The current message's content; rendering may lengthen it past Discord's limit."""
    while True:
        cut = splitting.first_cut(rest, limit)
        rendered = render(cut.piece if cut else rest)
        if len(rendered) <= MAX_MESSAGE_CHARS:
            return rendered, cut
        limit = min(limit, len(rest)) * 2 // 3


class _Messages:
    """What every delivery shares: a reply laid over a run of messages, each edited
    until the reply outgrows it. Subclasses say how a message is made and edited."""

    def __init__(self, api: DiscordApi, *, message_id: str | None = None) -> None:
        self._api = api
        self._limit = api.settings.max_message_chars
        self._message_id = message_id
        """The message being written; None until it is created."""
        self._shown: str | None = None
        self._consumed = 0
        self._carry = ""

    def state(self) -> dict[str, Any]:
        return {
            "message_id": self._message_id,
            "shown": self._shown is not None,
            "consumed": self._consumed,
            "carry": self._carry,
        }

    def restore(self, state: dict[str, Any]) -> None:
        message_id = state.get("message_id")
        self._message_id = str(message_id) if message_id else None
        # What the message shows was not saved, only that it shows something: "" is
        # never equal to new content (the next push edits it), and is not None (an
        # empty reply or an apology does not overwrite it).
        self._shown = "" if state.get("shown") and self._message_id else None
        self._consumed = int(state.get("consumed", 0))
        self._carry = str(state.get("carry", ""))

    def next_delay(self) -> float:
        return self._api.delay(self._next_call().bucket)

    def _next_call(self) -> Call:
        return self._create("") if self._message_id is None else self._edit(self._message_id, "")

    def _create(self, content: str) -> Call:
        raise NotImplementedError

    def _edit(self, message_id: str, content: str) -> Call:
        raise NotImplementedError

    async def _created(self, content: str) -> str:
        call = self._create(content)
        document = await self._api.send(call, interval=self._api.settings.post_interval_s)
        message_id = document.get("id") if isinstance(document, dict) else None
        if not isinstance(message_id, str):
            raise DiscordCallError(call.route, status=200, error="no message id in the answer")
        return message_id

    async def _edited(self, message_id: str, content: str) -> None:
        await self._api.send(
            self._edit(message_id, content), interval=self._api.settings.edit_interval_s
        )

    async def push(self, text: str, *, final: bool) -> None:
        while True:
            rest = self._carry + text[self._consumed :]
            content, cut = first_piece(rest, self._limit)
            if not content.strip() and final and self._must_show():
                content = EMPTY_REPLY_TEXT
            if content.strip() and content != self._shown:
                self._check_time()
                if self._message_id is None:
                    self._message_id = await self._created(content)
                else:
                    await self._edited(self._message_id, content)
                self._shown = content
            if cut is None:
                return
            self._consumed += cut.consumed - len(self._carry)
            self._carry, self._message_id, self._shown = cut.carry, None, None

    def _must_show(self) -> bool:
        """An empty reply still replaces what the user sees waiting (``/ask``'s "thinking…")."""
        return False

    def _check_time(self) -> None:
        return None


@dataclass(frozen=True)
class InteractionTarget:
    application_id: str
    token: str
    channel_id: str
    received_at: float
    """When the interaction arrived (wall clock): its token's 15 minutes count from here."""


class InteractionDelivery(_Messages):
    ORIGINAL = "@original"

    def __init__(
        self, api: DiscordApi, target: InteractionTarget, *, clock: Any = time.time
    ) -> None:
        # ``@original`` exists from the deferred response on: it is edited, never created.
        super().__init__(api, message_id=self.ORIGINAL)
        self._target = target
        self._clock = clock
        self._webhook = f"/webhooks/{target.application_id}/{target.token}"
        self._major = token_key(target.token)

    def _create(self, content: str) -> Call:
        return Call(
            "POST",
            "/webhooks/{application_id}/{token}",
            self._webhook,
            self._major,
            json=_content(content),
            bot_auth=False,
            query={"wait": "true"},
        )

    def _edit(self, message_id: str, content: str) -> Call:
        return Call(
            "PATCH",
            "/webhooks/{application_id}/{token}/messages/{message_id}",
            f"{self._webhook}/messages/{message_id}",
            self._major,
            json=_content(content),
            bot_auth=False,
        )

    def _must_show(self) -> bool:
        return self._message_id == self.ORIGINAL and self._shown is None

    def _check_time(self) -> None:
        deadline = self._target.received_at + INTERACTION_TOKEN_LIFETIME_S - TOKEN_MARGIN_S
        if self._clock() > deadline:
            raise TokenExpired()

    async def _edited(self, message_id: str, content: str) -> None:
        try:
            await super()._edited(message_id, content)
        except DiscordCallError as exc:
            # The deferred response may not have reached Discord yet: its webhook is not
            # known there for a moment. Inside the grace, that is "try again shortly".
            young = self._clock() - self._target.received_at < ACK_GRACE_S
            if message_id == self.ORIGINAL and exc.code == UNKNOWN_WEBHOOK and young:
                exc.retry_after = ACK_RETRY_S
            raise

    async def apologise(self, message: str) -> None:
        self._check_time()
        text = f"*{message}*"
        if self._message_id == self.ORIGINAL and self._shown is None:
            await self._edited(self.ORIGINAL, text)
        else:
            await self._created(text)


@dataclass(frozen=True)
class ChannelTarget:
    channel_id: str
    message_id: str
    """The user's message: the bot's first message answers it as a reply."""


class ChannelDelivery(_Messages):
    def __init__(self, api: DiscordApi, target: ChannelTarget) -> None:
        super().__init__(api)
        self._target = target
        self._first = True

    def _create(self, content: str) -> Call:
        body = _content(content)
        if self._first:
            body["message_reference"] = {
                "message_id": self._target.message_id,
                "fail_if_not_exists": False,
            }
        return Call(
            "POST",
            "/channels/{channel_id}/messages",
            f"/channels/{self._target.channel_id}/messages",
            self._target.channel_id,
            json=body,
        )

    def _edit(self, message_id: str, content: str) -> Call:
        return Call(
            "PATCH",
            "/channels/{channel_id}/messages/{message_id}",
            f"/channels/{self._target.channel_id}/messages/{message_id}",
            self._target.channel_id,
            json=_content(content),
        )

    async def _created(self, content: str) -> str:
        message_id = await super()._created(content)
        self._first = False
        return message_id

    def state(self) -> dict[str, Any]:
        return {**super().state(), "first": self._first}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self._first = bool(state.get("first", True))

    async def apologise(self, message: str) -> None:
        await self._created(f"*{message}*")
