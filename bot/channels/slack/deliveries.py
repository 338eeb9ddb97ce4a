"""The two ways a reply reaches Slack, each moving the thread to show a given text.

``push(text, final=...)`` is called with the cumulative reply; it makes only
the calls needed to go from what Slack shows now to ``text``, recording each
success at once, so a push interrupted by an error can simply be repeated.

- ``StreamDelivery``: chat.startStream / appendStream / stopStream, Markdown as is.
- ``UpdateDelivery``: chat.postMessage, then chat.update of the same message: a Markdown
  block with plain text beside it (``render``).

Both close a message at ``max_message_chars`` and go on in a new one.

``state()`` is where a delivery stands (the message being written and how much of
the reply is in the messages before it), JSON for ``delivery_state``; ``resumed``
builds the delivery a worker taking the turn over goes on with.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

from bot.channels.slack import splitting
from bot.channels.slack.api import SlackCallError
from bot.channels.slack.outbound import STREAMING_UNSUPPORTED_ERRORS, Outbound, ReplyTarget
from bot.channels.slack.render import SlackMessage, escape, render_reply
from bot.channels.slack.settings import SLACK_MAX_TEXT_CHARS

# markdown_text of one chat.startStream / appendStream / stopStream call.
STREAM_CALL_MAX_CHARS = 12_000
# A partial last word is held back while a space lies this close to the end.
_WORD_HOLD_BACK = 64


class StreamingUnsupported(Exception):
    """chat.startStream is not available here; nothing was shown yet."""


class StreamExpired(Exception):
    """Slack no longer takes appends to this stream; go on with chat.update on its ts."""

    def __init__(self, fallback: UpdateDelivery) -> None:
        super().__init__("message_not_in_streaming_state")
        self.fallback = fallback


class StoppedByUser(Exception):
    """The user pressed stop on the streaming message."""


class Delivery(Protocol):
    def next_delay(self) -> float: ...

    async def push(self, text: str, *, final: bool) -> None: ...

    async def apologise(self, message: str) -> None: ...

    def state(self) -> dict[str, Any]: ...


class UpdateDelivery:
    def __init__(
        self,
        out: Outbound,
        target: ReplyTarget,
        *,
        ts: str | None = None,
        consumed: int = 0,
        carry: str = "",
    ) -> None:
        self._out = out
        self._target = target
        self._limit = out.settings.max_message_chars
        self._ts = ts
        self._shown: SlackMessage | None = None
        self._consumed = consumed
        self._carry = carry

    def state(self) -> dict[str, Any]:
        return {"mode": "update", "ts": self._ts, "consumed": self._consumed, "carry": self._carry}

    def next_delay(self) -> float:
        if self._ts is None:
            return self._out.delay("chat.postMessage", self._target, None)
        return self._out.delay("chat.update", self._target, self._ts)

    def _body(self, rest: str) -> tuple[SlackMessage, splitting.Cut | None]:
        """The current message; escaping can lengthen its text past Slack's limit."""
        limit = self._limit
        while True:
            cut = splitting.first_cut(rest, limit)
            rendered = render_reply(cut.piece if cut else rest)
            if len(rendered.text) <= SLACK_MAX_TEXT_CHARS:
                return rendered, cut
            limit = min(limit, len(rest)) * 2 // 3

    async def push(self, text: str, *, final: bool) -> None:
        while True:
            rest = self._carry + text[self._consumed :]
            rendered, cut = self._body(rest)
            if rendered.text.strip() and rendered != self._shown:
                if self._ts is None:
                    self._ts = await self._out.post(self._target, rendered.text, rendered.blocks)
                else:
                    await self._out.update(self._target, self._ts, rendered.text, rendered.blocks)
                self._shown = rendered
            if cut is None:
                return
            self._consumed += cut.consumed - len(self._carry)
            self._carry, self._ts, self._shown = cut.carry, None, None

    async def apologise(self, message: str) -> None:
        await self._out.post(self._target, f"_{escape(message)}_")


class StreamDelivery:
    def __init__(
        self,
        out: Outbound,
        target: ReplyTarget,
        *,
        ts: str | None = None,
        sent: int = 0,
        consumed: int = 0,
        carry: str = "",
    ) -> None:
        self._out = out
        self._target = target
        self._limit = out.settings.max_message_chars
        self._ts = ts
        self._sent = sent
        """Characters of the current message's body already streamed."""
        self._consumed = consumed
        self._carry = carry
        self._closed_ts: str | None = None
        """The last message, once the final text closed its stream."""

    def state(self) -> dict[str, Any]:
        if self._closed_ts is not None:
            # The reply is all out; a worker taking over now (the turn not yet recorded
            # done) can only edit that message, never start it again.
            return {
                "mode": "update",
                "ts": self._closed_ts,
                "consumed": self._consumed,
                "carry": self._carry,
            }
        return {
            "mode": "stream",
            "ts": self._ts,
            "sent": self._sent,
            "consumed": self._consumed,
            "carry": self._carry,
        }

    def next_delay(self) -> float:
        if self._ts is None:
            return self._out.delay("chat.startStream", self._target, None)
        return self._out.delay("chat.appendStream", self._target, self._ts)

    def _expired(self) -> StreamExpired:
        return StreamExpired(
            UpdateDelivery(
                self._out, self._target, ts=self._ts, consumed=self._consumed, carry=self._carry
            )
        )

    def _guard(self, exc: SlackCallError) -> NoReturn:
        if exc.error == "message_not_in_streaming_state":
            raise self._expired() from None
        if exc.error == "stopped_by_user":
            raise StoppedByUser() from None
        if self._ts is None and exc.error in STREAMING_UNSUPPORTED_ERRORS:
            raise StreamingUnsupported(exc.error) from None
        raise exc

    async def _send(self, new: str) -> None:
        """Stream ``new`` into the current message, starting it if needed."""
        for start in range(0, len(new), STREAM_CALL_MAX_CHARS):
            part = new[start : start + STREAM_CALL_MAX_CHARS]
            try:
                if self._ts is None:
                    self._ts = await self._out.start_stream(self._target, part)
                else:
                    await self._out.append_stream(self._target, self._ts, part)
            except SlackCallError as exc:
                self._guard(exc)
            self._sent += len(part)

    async def _stop(self, tail: str | None) -> None:
        assert self._ts is not None
        try:
            await self._out.stop_stream(self._target, self._ts, tail or None)
        except SlackCallError as exc:
            self._guard(exc)
        if tail:
            self._sent += len(tail)

    async def push(self, text: str, *, final: bool) -> None:
        while True:
            rest = self._carry + text[self._consumed :]
            cut = splitting.first_cut(rest, self._limit, min_index=self._sent)
            body = cut.piece if cut else rest
            new = body[self._sent :]
            if cut is None and not final:
                # Stream whole words only, and never into the room a closing fence may
                # need: a later cut can then fall on the boundary where streaming stopped.
                room = self._limit - len(splitting.CLOSE_FENCE) - self._sent
                ready = new[:room]
                if len(ready) < len(new) or not ready[-1:].isspace():
                    space = max(ready.rfind(" "), ready.rfind("\n"))
                    # Text without spaces (CJK, one long token) streams as it comes.
                    if space >= len(ready) - _WORD_HOLD_BACK:
                        ready = ready[: space + 1]
                if ready.strip():
                    await self._send(ready)
                return
            if cut is None:
                if self._ts is None and not new.strip():
                    return
                # The last words ride on chat.stopStream: one call fewer.
                head, tail = new[:-STREAM_CALL_MAX_CHARS], new[-STREAM_CALL_MAX_CHARS:]
                if head or self._ts is None:
                    await self._send(head or tail)
                    tail = "" if not head else tail
                await self._stop(tail)
                self._closed_ts, self._ts = self._ts, None
                return
            if new:
                await self._send(new)
            await self._stop(None)
            self._consumed += cut.consumed - len(self._carry)
            self._carry, self._ts, self._sent = cut.carry, None, 0

    async def apologise(self, message: str) -> None:
        if self._ts is not None:
            await self._out.stop_stream(self._target, self._ts, f"\n\n_{message}_")
            self._ts = None
        else:
            await self._out.post(self._target, f"_{escape(message)}_")


def resumed(out: Outbound, target: ReplyTarget, state: dict[str, Any]) -> Delivery:
    """The delivery that goes on from a dead worker's ``state()``, in the same message.

    Its stream is appended to again: Slack knows a stream by channel and ts, not by
    the process that started it. A stream Slack has meanwhile ended is finished with
    chat.update of the same ts (``StreamExpired``), as in the worker that started it.
    """
    ts = state.get("ts")
    place: dict[str, Any] = {
        "ts": str(ts) if ts else None,
        "consumed": int(state.get("consumed", 0)),
        "carry": str(state.get("carry", "")),
    }
    if state.get("mode") == "stream":
        return StreamDelivery(out, target, sent=int(state.get("sent", 0)) if ts else 0, **place)
    return UpdateDelivery(out, target, **place)
