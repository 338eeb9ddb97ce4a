"""Paced message calls of one Slack app, shared by all its reply sinks.

Before each call: wait out any ``Retry-After`` Slack gave for the method in
this workspace, take a token from the method's tier bucket, and keep the
per-message (or, for new messages, per-channel) spacing. A 429 blocks the
method for the workspace for ``Retry-After`` seconds and is re-raised: the
caller decides whether the call is still worth making.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from bot.channels.slack.api import SlackApi, SlackCallError
from bot.channels.slack.pacing import Pacer
from bot.channels.slack.settings import SlackAppSettings

# Workspace-wide tiers (calls a minute) and the burst we allow ourselves.
# chat.update is Tier 3 and chat.appendStream Tier 4 in Slack's method
# reference; the start/stop calls are taken to share the streaming tier.
TIER_PER_MINUTE: dict[str, float] = {
    "chat.update": 50,
    "chat.startStream": 100,
    "chat.appendStream": 100,
    "chat.stopStream": 100,
}
TIER_BURST = 10
# A 429 without Retry-After (Slack always sends one; a proxy might not).
DEFAULT_RETRY_AFTER_S = 1.0
# Errors on chat.startStream that mean "this workspace or app cannot stream".
STREAMING_UNSUPPORTED_ERRORS = frozenset(
    {"unknown_method", "not_allowed_token_type", "method_deprecated", "deprecated_endpoint"}
)


@dataclass(frozen=True)
class ReplyTarget:
    """Where one turn's reply goes, read back from ``InboundMessage.reply_to``."""

    team_id: str
    channel_id: str
    thread_ts: str | None
    message_ts: str
    user_id: str | None
    is_dm: bool

    @classmethod
    def from_reply_to(cls, reply_to: dict[str, Any]) -> ReplyTarget:
        return cls(
            team_id=str(reply_to["team_id"]),
            channel_id=str(reply_to["channel_id"]),
            thread_ts=reply_to.get("thread_ts"),
            message_ts=str(reply_to["message_ts"]),
            user_id=reply_to.get("user_id"),
            is_dm=bool(reply_to.get("is_dm")),
        )

    @property
    def stream_thread_ts(self) -> str:
        # Streams are always thread replies; a top-level DM message gets its own thread.
        return self.thread_ts or self.message_ts


class Outbound:
    def __init__(
        self, api: SlackApi, settings: SlackAppSettings, pacer: Pacer | None = None
    ) -> None:
        self.api = api
        self.settings = settings
        self.pacer = pacer or Pacer()
        self._streaming: dict[str, bool] = {}

    # -- streaming support, learnt per workspace ---------------------------------

    def streams(self, team_id: str) -> bool:
        mode = self.settings.streaming
        if mode == "update":
            return False
        return mode == "stream" or self._streaming.get(team_id, True)

    def streaming_unsupported(self, team_id: str) -> None:
        if self.settings.streaming == "auto":
            self._streaming[team_id] = False

    # -- pacing ------------------------------------------------------------------

    def _keys(self, method: str, target: ReplyTarget, ts: str | None) -> tuple[Any, Any]:
        # chat.postMessage is limited per channel, the other methods per workspace.
        block_key: tuple[str, ...] = (method, target.team_id)
        if method == "chat.postMessage":
            block_key = (method, target.team_id, target.channel_id)
        space_key = (method, target.team_id, target.channel_id, ts)
        return block_key, space_key

    def _interval(self, method: str) -> float:
        if method == "chat.update":
            return self.settings.update_interval_s
        if method in ("chat.appendStream", "chat.stopStream"):
            return self.settings.stream_interval_s
        return self.settings.post_interval_s

    def delay(self, method: str, target: ReplyTarget, ts: str | None) -> float:
        block_key, space_key = self._keys(method, target, ts)
        return max(self.pacer.delay(block_key), self.pacer.delay(space_key))

    async def _pace(self, method: str, target: ReplyTarget, ts: str | None) -> None:
        block_key, space_key = self._keys(method, target, ts)
        await self.pacer.wait(block_key, 0.0)
        if method in TIER_PER_MINUTE:
            await self.pacer.take(
                (method, target.team_id, "tier"), TIER_PER_MINUTE[method], TIER_BURST
            )
        await self.pacer.wait(space_key, self._interval(method))

    def _blocked(self, exc: SlackCallError, target: ReplyTarget) -> SlackCallError:
        if exc.retry_after is not None or exc.status == 429:
            exc.retry_after = (
                exc.retry_after if exc.retry_after is not None else DEFAULT_RETRY_AFTER_S
            )
            self.pacer.block(self._keys(exc.method, target, None)[0], exc.retry_after)
        return exc

    @contextlib.asynccontextmanager
    async def _paced(self, method: str, target: ReplyTarget, ts: str | None) -> AsyncIterator[None]:
        await self._pace(method, target, ts)
        try:
            yield
        except SlackCallError as exc:
            raise self._blocked(exc, target) from None

    # -- calls ---------------------------------------------------------------------

    async def post(
        self, target: ReplyTarget, text: str, blocks: list[dict[str, Any]] | None = None
    ) -> str:
        async with self._paced("chat.postMessage", target, None):
            return await self.api.post_message(
                channel=target.channel_id, text=text, thread_ts=target.thread_ts, blocks=blocks
            )

    async def update(
        self, target: ReplyTarget, ts: str, text: str, blocks: list[dict[str, Any]] | None = None
    ) -> None:
        async with self._paced("chat.update", target, ts):
            await self.api.update(channel=target.channel_id, ts=ts, text=text, blocks=blocks)

    async def start_stream(self, target: ReplyTarget, markdown_text: str) -> str:
        async with self._paced("chat.startStream", target, None):
            return await self.api.start_stream(
                channel=target.channel_id,
                thread_ts=target.stream_thread_ts,
                markdown_text=markdown_text,
                recipient_team_id=target.team_id,
                recipient_user_id=target.user_id,
            )

    async def append_stream(self, target: ReplyTarget, ts: str, markdown_text: str) -> None:
        async with self._paced("chat.appendStream", target, ts):
            await self.api.append_stream(
                channel=target.channel_id, ts=ts, markdown_text=markdown_text
            )

    async def stop_stream(self, target: ReplyTarget, ts: str, markdown_text: str | None) -> None:
        async with self._paced("chat.stopStream", target, ts):
            await self.api.stop_stream(
                channel=target.channel_id, ts=ts, markdown_text=markdown_text
            )
