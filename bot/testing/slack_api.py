"""A strict fake of the Slack Web API on loopback, for tests.

It answers like Slack (HTTP 200 with ``{"ok": false, "error": "..."}``, and
HTTP 429 + ``Retry-After`` for ``ratelimited``) and checks every call:

- the method exists (else ``unknown_method``), the bot token in the
  ``Authorization: Bearer`` header (``not_authed`` / ``invalid_auth`` /
  ``token_revoked`` / ``account_inactive``); a token in the URL is recorded in
  ``token_in_url`` (it would end up in access logs);
- required arguments, and no unknown ones (``invalid_arg_name``: stricter than
  Slack, so a misspelt argument fails a test instead of being dropped);
- ``text`` at most 40,000 characters, ``markdown_text`` at most 12,000 per call
  (``msg_too_long``), and never empty (``no_text``);
- ``blocks``: a list of blocks; ``markdown`` blocks need text, 12,000 characters
  at most in all (``invalid_blocks``);
- streams: chat.startStream needs ``thread_ts`` and, outside DMs,
  ``recipient_team_id`` + ``recipient_user_id``; appends and stops only on a
  message still streaming (``message_not_in_streaming_state``); a workspace
  can be set to lack the methods (``unknown_method``);
- pacing: calls of one method to one channel closer than its configured
  interval get 429 with ``Retry-After``; every call while that wait runs is
  refused again and counted in ``violations``.

Tests read ``calls``, ``thread(channel, thread_ts)`` (what the thread shows
now), ``unchanged_updates``, ``violations``, and inject failures with
``fail``, ``revoke``, ``channel_errors``, ``expire_stream``, ``stop_by_user``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_TEXT = 40_000
MAX_MARKDOWN_TEXT = 12_000
TS_FORMAT = re.compile(r"^\d{10}\.\d{6}$")

_POST_OPTIONAL = {
    "text",
    "blocks",
    "attachments",
    "markdown_text",
    "thread_ts",
    "mrkdwn",
    "reply_broadcast",
    "unfurl_links",
    "unfurl_media",
    "username",
    "icon_emoji",
    "icon_url",
    "metadata",
    "parse",
    "link_names",
}
# method -> (required, optional) argument names.
SIGNATURES: dict[str, tuple[set[str], set[str]]] = {
    "auth.test": (set(), set()),
    "users.info": ({"user"}, {"include_locale"}),
    "chat.postMessage": ({"channel"}, _POST_OPTIONAL),
    "chat.update": (
        {"channel", "ts"},
        {"text", "blocks", "attachments", "markdown_text", "parse", "link_names", "metadata"},
    ),
    "chat.startStream": (
        {"channel", "thread_ts"},
        {
            "markdown_text",
            "chunks",
            "recipient_team_id",
            "recipient_user_id",
            "task_display_mode",
            "icon_emoji",
            "icon_url",
            "username",
        },
    ),
    "chat.appendStream": ({"channel", "ts"}, {"markdown_text", "chunks"}),
    "chat.stopStream": (
        {"channel", "ts"},
        {"markdown_text", "chunks", "blocks", "metadata", "session_status"},
    ),
}
STREAM_METHODS = frozenset({"chat.startStream", "chat.appendStream", "chat.stopStream"})
# Calls that post or change messages: the ones paced per channel.
PACED = frozenset({"chat.postMessage", "chat.update", *STREAM_METHODS})


@dataclass
class Workspace:
    team_id: str
    bot_user_id: str
    bot_id: str
    streaming: bool = True
    revoked: bool = False
    inactive: bool = False


@dataclass
class Call:
    method: str
    args: dict[str, Any]
    team_id: str | None
    status: int
    response: dict[str, Any]
    at: float

    @property
    def ok(self) -> bool:
        return bool(self.response.get("ok"))


@dataclass
class Message:
    channel: str
    ts: str
    thread_ts: str | None
    text: str
    via: str
    """``post`` (chat.postMessage) or ``stream`` (chat.startStream)."""
    streaming: bool = False
    edits: int = 0
    appends: int = 0
    stopped_by_user: bool = False
    blocks: list[dict[str, Any]] | None = None


@dataclass
class FakeSlackApi:
    intervals: dict[str, float] = field(default_factory=dict)
    """Minimum seconds between calls of a method to one channel; 0 or absent: unpaced."""
    retry_after_s: int = 1
    delays: dict[str, float] = field(default_factory=dict)
    """Seconds a method takes to answer (to test timeouts)."""

    def __post_init__(self) -> None:
        self.workspaces: dict[str, Workspace] = {}
        self.users: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[Call] = []
        self.arrived: list[str] = []
        """Methods in the order their requests came in, answered or not yet."""
        self.messages: dict[tuple[str, str], Message] = {}
        self.channel_errors: dict[str, str] = {}
        self.unchanged_updates = 0
        self.violations = 0
        self.token_in_url = 0
        self._failures: list[tuple[str, str, int, float | None]] = []
        self._last_call: dict[tuple[str, str, str], float] = {}
        self._blocked_until: dict[tuple[str, str, str], float] = {}
        self._ts_counter = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    # -- set-up ------------------------------------------------------------------------

    def add_workspace(
        self, token: str, team_id: str, *, bot_user_id: str = "UBOT0001", bot_id: str = "BBOT0001"
    ) -> Workspace:
        workspace = Workspace(team_id, bot_user_id, bot_id)
        self.workspaces[token] = workspace
        return workspace

    def add_user(
        self, team_id: str, user_id: str, *, display_name: str, real_name: str = ""
    ) -> None:
        self.users[(team_id, user_id)] = {
            "id": user_id,
            "team_id": team_id,
            "name": display_name.lower().replace(" ", "."),
            "real_name": real_name or display_name,
            "profile": {"display_name": display_name, "real_name": real_name or display_name},
        }

    def fail(
        self,
        method: str,
        error: str,
        *,
        times: int = 1,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        """The next ``times`` calls of ``method`` answer ``error``, with HTTP ``status``
        (default: 429 for ``ratelimited``, else 200 as Slack answers refusals; a 5xx is
        Slack's own trouble)."""
        for _ in range(times):
            code = status if status is not None else 429 if error == "ratelimited" else 200
            self._failures.append((method, error, code, retry_after))

    def drop_connection(self, method: str, *, times: int = 1) -> None:
        """Close the connection of the next ``times`` calls of ``method`` without an answer,
        before the call is carried out."""
        for _ in range(times):
            self._failures.append((method, "", 0, None))

    def revoke(self, token: str) -> None:
        self.workspaces[token].revoked = True

    def expire_stream(self, channel: str, ts: str) -> None:
        """Slack ended the stream on its side (e.g. it ran too long)."""
        self.messages[(channel, ts)].streaming = False

    def stop_by_user(self, channel: str, ts: str) -> None:
        self.messages[(channel, ts)].stopped_by_user = True

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle)
        # A short shutdown: a test may leave a deliberately slow call unanswered.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/api/"
        return self.base_url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- reading ---------------------------------------------------------------------

    def calls_to(self, method: str, *, ok: bool | None = None) -> list[Call]:
        return [c for c in self.calls if c.method == method and (ok is None or c.ok == ok)]

    def thread(self, channel: str, thread_ts: str | None) -> list[Message]:
        """Bot messages in a thread (or top level when ``thread_ts`` is None), oldest first."""
        found = [
            m for m in self.messages.values() if m.channel == channel and m.thread_ts == thread_ts
        ]
        return sorted(found, key=lambda m: m.ts)

    def thread_text(self, channel: str, thread_ts: str | None) -> list[str]:
        return [m.text for m in self.thread(channel, thread_ts)]

    # -- serving ---------------------------------------------------------------------

    def _new_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts_counter):06d}"

    async def _read_args(self, request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError("invalid_form_data")
                args.update(body)
            else:
                args.update(dict(await request.post()))
        if "token" in request.query:
            self.token_in_url += 1
        return args

    def _answer(
        self,
        method: str,
        args: dict[str, Any],
        team_id: str | None,
        response: dict[str, Any],
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        self.calls.append(Call(method, args, team_id, status, response, time.monotonic()))
        return web.json_response(response, status=status, headers=headers)

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        self.arrived.append(method)
        try:
            args = await self._read_args(request)
        except (ValueError, json.JSONDecodeError):
            return self._answer(method, {}, None, {"ok": False, "error": "invalid_form_data"})
        if method in self.delays:
            await asyncio.sleep(self.delays[method])
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else args.pop("token", None)
        args.pop("token", None)
        if method not in SIGNATURES:
            return self._answer(method, args, None, {"ok": False, "error": "unknown_method"})
        if not token:
            return self._answer(method, args, None, {"ok": False, "error": "not_authed"})
        workspace = self.workspaces.get(token)
        if workspace is None:
            return self._answer(method, args, None, {"ok": False, "error": "invalid_auth"})
        team = workspace.team_id
        if workspace.revoked:
            return self._answer(method, args, team, {"ok": False, "error": "token_revoked"})
        if workspace.inactive:
            return self._answer(method, args, team, {"ok": False, "error": "account_inactive"})
        if method in STREAM_METHODS and not workspace.streaming:
            return self._answer(method, args, team, {"ok": False, "error": "unknown_method"})

        required, optional = SIGNATURES[method]
        missing = sorted(required - args.keys())
        if missing:
            return self._answer(
                method, args, team, {"ok": False, "error": "invalid_arguments", "missing": missing}
            )
        unknown = sorted(args.keys() - required - optional)
        if unknown:
            return self._answer(
                method, args, team, {"ok": False, "error": "invalid_arg_name", "args": unknown}
            )

        limited = self._rate_check(method, team, args)
        if limited is not None:
            return self._answer(
                method,
                args,
                team,
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(limited)},
            )
        for index, (name, error, status, retry_after) in enumerate(self._failures):
            if name == method:
                del self._failures[index]
                if status == 0:
                    self.calls.append(Call(method, args, team, 0, {}, time.monotonic()))
                    assert request.transport is not None
                    request.transport.close()
                    return web.Response(status=500)  # never sent: the connection is gone
                headers = (
                    {"Retry-After": str(retry_after or self.retry_after_s)}
                    if status == 429
                    else None
                )
                return self._answer(
                    method,
                    args,
                    team,
                    {"ok": False, "error": error},
                    status=status,
                    headers=headers,
                )
        channel = args.get("channel")
        if isinstance(channel, str) and channel in self.channel_errors:
            return self._answer(
                method, args, team, {"ok": False, "error": self.channel_errors[channel]}
            )
        response = getattr(self, "_m_" + method.replace(".", "_"))(workspace, args)
        return self._answer(method, args, team, response)

    def _rate_check(self, method: str, team: str, args: dict[str, Any]) -> int | None:
        interval = self.intervals.get(method, 0.0)
        if method not in PACED or not interval:
            return None
        key = (method, team, str(args.get("channel")))
        now = time.monotonic()
        blocked = self._blocked_until.get(key, 0.0)
        if blocked > now:
            self.violations += 1
            return max(1, round(blocked - now + 0.49))
        last = self._last_call.get(key)
        self._last_call[key] = now
        if last is not None and now - last < interval:
            self._blocked_until[key] = now + self.retry_after_s
            return self.retry_after_s
        return None

    # -- methods ---------------------------------------------------------------------

    def _m_auth_test(self, ws: Workspace, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "team_id": ws.team_id,
            "user_id": ws.bot_user_id,
            "bot_id": ws.bot_id,
        }

    def _m_users_info(self, ws: Workspace, args: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get((ws.team_id, args["user"]))
        if user is None:
            return {"ok": False, "error": "user_not_found"}
        return {"ok": True, "user": user}

    @staticmethod
    def _text_error(text: Any, limit: int) -> str | None:
        if not isinstance(text, str) or not text.strip():
            return "no_text"
        if len(text) > limit:
            return "msg_too_long"
        return None

    @staticmethod
    def _blocks_error(blocks: Any) -> str | None:
        if blocks is None:
            return None
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            return "invalid_blocks"
        markdown = [b for b in blocks if b.get("type") == "markdown"]
        texts = [b.get("text") for b in markdown]
        if not all(isinstance(t, str) and t.strip() for t in texts):
            return "invalid_blocks"
        if sum(len(t) for t in texts if isinstance(t, str)) > MAX_MARKDOWN_TEXT:
            return "invalid_blocks"
        return None

    def _m_chat_postMessage(self, ws: Workspace, args: dict[str, Any]) -> dict[str, Any]:
        if "markdown_text" in args:
            error = self._text_error(args["markdown_text"], MAX_MARKDOWN_TEXT)
        else:
            error = self._text_error(args.get("text"), MAX_TEXT)
        error = error or self._blocks_error(args.get("blocks"))
        if error:
            return {"ok": False, "error": error}
        thread_ts = args.get("thread_ts")
        if thread_ts is not None and not TS_FORMAT.match(str(thread_ts)):
            return {"ok": False, "error": "invalid_thread_ts"}
        ts = self._new_ts()
        text = args.get("text") or args.get("markdown_text") or ""
        self.messages[(args["channel"], ts)] = Message(
            args["channel"], ts, thread_ts, text, "post", blocks=args.get("blocks")
        )
        return {"ok": True, "channel": args["channel"], "ts": ts, "message": {"text": text}}

    def _m_chat_update(self, ws: Workspace, args: dict[str, Any]) -> dict[str, Any]:
        message = self.messages.get((args["channel"], args["ts"]))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        error = self._text_error(args.get("text"), MAX_TEXT) or self._blocks_error(
            args.get("blocks")
        )
        if error:
            return {"ok": False, "error": error}
        if args["text"] == message.text and args.get("blocks") == message.blocks:
            self.unchanged_updates += 1
        message.text = args["text"]
        message.blocks = args.get("blocks")
        message.edits += 1
        return {"ok": True, "channel": args["channel"], "ts": args["ts"], "text": args["text"]}

    def _stream_text(self, args: dict[str, Any]) -> tuple[str, str | None]:
        parts: list[str] = []
        if "markdown_text" in args:
            if not isinstance(args["markdown_text"], str):
                return "", "invalid_arguments"
            parts.append(args["markdown_text"])
        for chunk in args.get("chunks") or []:
            if not isinstance(chunk, dict) or chunk.get("type") != "markdown_text":
                return "", "invalid_chunks"
            parts.append(str(chunk.get("text", "")))
        text = "".join(parts)
        if len(text) > MAX_MARKDOWN_TEXT:
            return "", "msg_too_long"
        return text, None

    def _m_chat_startStream(self, ws: Workspace, args: dict[str, Any]) -> dict[str, Any]:
        channel = args["channel"]
        if not TS_FORMAT.match(str(args["thread_ts"])):
            return {"ok": False, "error": "invalid_thread_ts"}
        if not channel.startswith("D"):
            if not args.get("recipient_team_id"):
                return {"ok": False, "error": "missing_recipient_team_id"}
            if not args.get("recipient_user_id"):
                return {"ok": False, "error": "missing_recipient_user_id"}
        text, error = self._stream_text(args)
        if error:
            return {"ok": False, "error": error}
        ts = self._new_ts()
        self.messages[(channel, ts)] = Message(
            channel, ts, args["thread_ts"], text, "stream", streaming=True
        )
        return {"ok": True, "channel": channel, "ts": ts}

    def _streaming_message(self, args: dict[str, Any]) -> tuple[Message | None, str | None]:
        message = self.messages.get((args["channel"], args["ts"]))
        if message is None:
            return None, "message_not_found"
        if message.stopped_by_user:
            return None, "stopped_by_user"
        if not message.streaming:
            return None, "message_not_in_streaming_state"
        return message, None

    def _m_chat_appendStream(self, ws: Workspace, args: dict[str, Any]) -> dict[str, Any]:
        message, error = self._streaming_message(args)
        if message is None:
            return {"ok": False, "error": error}
        text, error = self._stream_text(args)
        if error or not text:
            return {"ok": False, "error": error or "no_text"}
        message.text += text
        message.appends += 1
        return {"ok": True, "channel": args["channel"], "ts": args["ts"]}

    def _m_chat_stopStream(self, ws: Workspace, args: dict[str, Any]) -> dict[str, Any]:
        message, error = self._streaming_message(args)
        if message is None:
            return {"ok": False, "error": error}
        text, error = self._stream_text(args)
        if error:
            return {"ok": False, "error": error}
        message.text += text
        message.streaming = False
        return {
            "ok": True,
            "channel": args["channel"],
            "ts": args["ts"],
            "message": {"text": message.text, "bot_id": ws.bot_id, "subtype": "bot_message"},
        }
