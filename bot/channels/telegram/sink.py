"""Telegram reply sinks: typing, paced previews, the final delivery.

The paced pump (``bot.channels.pump``) sends at most one preview step per
pacing slot, always of the newest text. A preview step that Telegram answers
with 429 is dropped: the chat is then held for ``retry_after`` and the next
step, or the final delivery, goes after it. The final delivery (and the
apology) of one reply share a ``DeliveryRetry``: 429s, 5xx, dropped
connections and timeouts are tried again while the reply's time lost to
failures stays within ``max_flood_wait_s`` (``bot.channels.delivery_retry``).

- Private chats (``PrivateReplySink``): ``sendMessageDraft`` shows an
  ephemeral preview that Telegram drops when a real message arrives, so the
  reply is persisted with ``sendMessage``. A reply longer than one message
  sends each completed chunk as a message as soon as the next chunk starts,
  and drafts the rest under a fresh ``draft_id``.
- Groups (``GroupReplySink``) have no drafts: the first text goes out with
  ``sendMessage`` (as a reply to the user's message, so the group sees whom
  the bot answers), then ``editMessageText`` follows the reply, only when the
  rendered text changed (Telegram refuses an identical edit). A chunk that is
  complete gets its last edit, and the reply continues in a new message.
"""

from __future__ import annotations

import asyncio
import secrets
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

import structlog

from bot.channels.pump import PacedReplySink
from bot.channels.telegram.api import TelegramApi, TelegramApiError
from bot.channels.telegram.render import Rendered, Renderer
from bot.errors import DeliveryError, ErrorClass

log = structlog.get_logger(__name__)

MAX_TYPING_S = 600.0
"""Longest a sink keeps showing "typing" without any text."""
EMPTY_REPLY_TEXT = "…"
"""Sent when the model's reply is empty: Telegram refuses an empty message."""


@dataclass(frozen=True)
class ReplyTarget:
    """Where a turn's reply goes, from ``InboundMessage.reply_to``."""

    chat_id: int
    chat_type: str
    message_id: int | None
    message_thread_id: int | None

    @classmethod
    def from_reply_to(cls, reply_to: dict[str, Any]) -> ReplyTarget:
        return cls(
            chat_id=int(reply_to["chat_id"]),
            chat_type=str(reply_to.get("chat_type", "private")),
            message_id=reply_to.get("message_id"),
            message_thread_id=reply_to.get("message_thread_id"),
        )

    def base_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"chat_id": self.chat_id}
        if self.message_thread_id is not None:
            params["message_thread_id"] = self.message_thread_id
        return params


def _is_fatal(exc: TelegramApiError) -> bool:
    """Errors no later call to this chat can get past: stop previewing."""
    return exc.error_class is ErrorClass.AUTH or exc.error_code == 403


class TelegramReplySink(PacedReplySink):
    """What both sinks share: typing, rendering with a plain-text fallback, the pump hooks."""

    def __init__(
        self,
        api: TelegramApi,
        target: ReplyTarget,
        renderer: Renderer,
        *,
        typing_refresh_s: float,
        turn_id: str = "",
        delivery: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            log=log.bind(turn_id=turn_id, chat_id=target.chat_id),
            task_name=f"telegram-reply-{turn_id}",
        )
        self._api = api
        self._target = target
        self._renderer = renderer
        self._typing_refresh_s = typing_refresh_s
        self._typing: asyncio.Task[None] | None = None
        self._fatal = False
        self._retry = api.new_retry()
        if delivery:
            self._restore(delivery)

    # -- taken over by another worker (``bot.turns.replies.ResumableSink``) ------------

    @abstractmethod
    def delivery_state(self) -> dict[str, Any] | None:
        """What another worker needs to go on with this reply's messages if this one dies."""

    @abstractmethod
    def _restore(self, state: dict[str, Any]) -> None:
        """Go on from a dead worker's ``delivery_state``: edit its messages, send none twice."""

    # -- subclass hooks ----------------------------------------------------------

    @abstractmethod
    async def _push_partial(self, text: str) -> bool:
        """Show the reply so far; True once something is visible. Raises ``TelegramApiError``."""

    @abstractmethod
    async def _deliver_final(self, text: str) -> None:
        """Deliver ``text`` completely, retrying transient failures. Raises ``TelegramApiError``."""

    # -- the pump's delivery ---------------------------------------------------------

    async def start(self) -> None:
        self._typing = asyncio.create_task(self._typing_loop())

    def _next_delay(self) -> float:
        return self._api.pacer.delay(self._target.chat_id)

    async def _push(self, text: str, *, final: bool) -> bool:
        try:
            if final:
                await self._stop_typing()
                await self._deliver_final(text if text.strip() else EMPTY_REPLY_TEXT)
            elif await self._push_partial(text):
                await self._stop_typing()
        except TelegramApiError as exc:
            self._fatal = _is_fatal(exc)
            if final or self._fatal:
                raise DeliveryError(exc.error_class, str(exc)) from None
            # Dropped: the newest text goes out with the next step or the final delivery.
            self._log.info("telegram_preview_dropped", error=str(exc))
        return False

    async def _apologise(self, error_class: ErrorClass, user_message: str) -> None:
        await self._stop_typing()
        if self._fatal:
            return  # blocked or unauthorised: no call to this chat can get through
        partial = self.text_so_far.rstrip()
        text = f"{partial}\n\n{user_message}" if partial else user_message
        try:
            await self._deliver_final(text)
        except TelegramApiError as exc:
            # The turn already failed for its own reason; this only goes to the log.
            self._log.warning(
                "telegram_fail_notice_undelivered",
                error_class=exc.error_class.value,
                error=str(exc),
            )

    # -- machinery -------------------------------------------------------------------

    async def _call(self, method: str, params: dict[str, Any], *, final: bool) -> Any:
        # Previews are not retried: the next step or the final delivery carries the newest text.
        return await self._api.call(method, params, retry=self._retry if final else False)

    async def _send_rendered(
        self,
        method: str,
        params: dict[str, Any],
        chunks: list[str],
        index: int,
        *,
        final: bool,
    ) -> tuple[Any, Rendered | None]:
        """Send chunk ``index`` with ``method``; on refused entities, once more as plain text."""
        rendered = self._renderer.render(chunks, index)
        if rendered is None:
            return None, None
        try:
            return await self._call(method, {**params, **rendered.params()}, final=final), rendered
        except TelegramApiError as exc:
            if not (exc.is_entity_error and rendered.parse_mode is not None):
                raise
            self._log.warning("telegram_entities_refused", method=method, error=exc.description)
            self._renderer.plain = True
            rendered = self._renderer.render(chunks, index)
            assert rendered is not None
            return await self._call(method, {**params, **rendered.params()}, final=final), rendered

    async def _typing_loop(self) -> None:
        params = {**self._target.base_params(), "action": "typing"}
        # Bounded, so a turn that never reaches finish or fail cannot type forever.
        for _ in range(int(MAX_TYPING_S / self._typing_refresh_s) + 1):
            try:
                await self._api.call("sendChatAction", params)
            except TelegramApiError as exc:
                if _is_fatal(exc):
                    return
                self._log.debug("telegram_typing_failed", error=str(exc))
            await asyncio.sleep(self._typing_refresh_s)

    async def _stop_typing(self) -> None:
        if self._typing is not None:
            self._typing.cancel()
            # ``wait`` neither raises the task's outcome nor passes our own cancellation on.
            await asyncio.wait({self._typing})
            self._typing = None


_MAX_DRAFT_ID = 2**31 - 1


def _new_draft_id() -> int:
    return secrets.randbelow(_MAX_DRAFT_ID) + 1  # must be non-zero


class PrivateReplySink(TelegramReplySink):
    """Private chats: a live draft while streaming, real messages at the end."""

    _sent = 0
    """Chunks already delivered as messages."""
    _draft_id = 0
    _last_draft: Rendered | None = None

    def delivery_state(self) -> dict[str, Any] | None:
        return {"sent": self._sent, "draft_id": self._draft_id}

    def _restore(self, state: dict[str, Any]) -> None:
        self._sent = int(state.get("sent", 0))
        # The same draft goes on growing; a new one would show beside it.
        self._draft_id = int(state.get("draft_id", 0))

    async def _send_message(self, chunks: list[str], index: int, *, final: bool) -> None:
        params: dict[str, Any] = self._target.base_params()
        await self._send_rendered("sendMessage", params, chunks, index, final=final)
        self._sent = index + 1
        self._draft_id, self._last_draft = 0, None

    async def _push_partial(self, text: str) -> bool:
        chunks = self._renderer.split(text)
        while self._sent < len(chunks) - 1:
            await self._send_message(chunks, self._sent, final=False)
        index = len(chunks) - 1
        rendered = self._renderer.render(chunks, index)
        if rendered is None or rendered == self._last_draft:
            return self._sent > 0 or self._last_draft is not None
        if not self._draft_id:
            self._draft_id = _new_draft_id()
        params = {**self._target.base_params(), "draft_id": self._draft_id}
        _, self._last_draft = await self._send_rendered(
            "sendMessageDraft", params, chunks, index, final=False
        )
        return True

    async def _deliver_final(self, text: str) -> None:
        chunks = self._renderer.split(text)
        for index in range(self._sent, len(chunks)):
            await self._send_message(chunks, index, final=True)


class GroupReplySink(TelegramReplySink):
    """Groups: one message per chunk, edited as the reply grows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._messages: dict[int, tuple[int, Rendered | None]] = getattr(self, "_messages", {})
        """chunk index -> (message_id, what that message shows now; None: not known here)."""

    def delivery_state(self) -> dict[str, Any] | None:
        return {"messages": {str(index): sent[0] for index, sent in self._messages.items()}}

    def _restore(self, state: dict[str, Any]) -> None:
        # Called from the base constructor, before this class's attributes are set.
        messages = state.get("messages", {})
        self._messages = {
            int(index): (int(message_id), None) for index, message_id in messages.items()
        }

    async def _sync(self, text: str, *, final: bool) -> bool:
        chunks = self._renderer.split(text)
        for index in range(len(chunks)):
            rendered = self._renderer.render(chunks, index)
            if rendered is None:
                continue
            if index not in self._messages:
                await self._send(chunks, index, final=final)
            elif rendered != self._messages[index][1]:
                await self._edit(chunks, index, final=final)
        return bool(self._messages)

    async def _send(self, chunks: list[str], index: int, *, final: bool) -> None:
        params: dict[str, Any] = self._target.base_params()
        if not self._messages and self._target.message_id is not None:
            params["reply_parameters"] = {
                "message_id": self._target.message_id,
                "allow_sending_without_reply": True,
            }
        result, rendered = await self._send_rendered(
            "sendMessage", params, chunks, index, final=final
        )
        if rendered is not None:
            self._messages[index] = (int(result["message_id"]), rendered)

    async def _edit(self, chunks: list[str], index: int, *, final: bool) -> None:
        message_id = self._messages[index][0]
        # editMessageText addresses the message by chat and id; it takes no thread.
        params = {"chat_id": self._target.chat_id, "message_id": message_id}
        try:
            _, rendered = await self._send_rendered(
                "editMessageText", params, chunks, index, final=final
            )
        except TelegramApiError as exc:
            if not exc.is_not_modified:
                raise
            # Telegram trims and normalises text: what differs for us may not for it.
            rendered = self._renderer.render(chunks, index)
        if rendered is not None:
            self._messages[index] = (message_id, rendered)

    async def _push_partial(self, text: str) -> bool:
        return await self._sync(text, final=False)

    async def _deliver_final(self, text: str) -> None:
        await self._sync(text, final=True)
