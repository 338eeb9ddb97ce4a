"""Reply sink for private chats: a live draft while streaming, real messages at the end.

``sendMessageDraft`` shows an ephemeral preview that Telegram drops when a
real message arrives, so the reply is persisted with ``sendMessage``. A reply
longer than one message sends each completed chunk as a message as soon as
the next chunk starts, and drafts the rest under a fresh ``draft_id``.
"""

from __future__ import annotations

import secrets
from typing import Any

from bot.channels.telegram.render import Rendered
from bot.channels.telegram.sink_base import StreamingSink

_MAX_DRAFT_ID = 2**31 - 1


def _new_draft_id() -> int:
    return secrets.randbelow(_MAX_DRAFT_ID) + 1  # must be non-zero


class PrivateReplySink(StreamingSink):
    _sent = 0
    """Chunks already delivered as messages."""
    _draft_id = 0
    _last_draft: Rendered | None = None

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
