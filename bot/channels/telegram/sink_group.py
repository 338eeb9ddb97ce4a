"""Reply sink for groups: one message per chunk, edited as the reply grows.

Groups have no drafts: the first text goes out with ``sendMessage`` (as a
reply to the user's message, so the group sees whom the bot answers), then
``editMessageText`` follows the reply, only when the rendered text changed
(Telegram refuses an identical edit). A chunk that is complete gets its last
edit, and the reply continues in a new message.
"""

from __future__ import annotations

from typing import Any

from bot.channels.telegram.api import TelegramApiError
from bot.channels.telegram.render import Rendered
from bot.channels.telegram.sink_base import StreamingSink


class GroupReplySink(StreamingSink):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._messages: dict[int, tuple[int, Rendered]] = {}
        """chunk index -> (message_id, what that message shows now)."""

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
