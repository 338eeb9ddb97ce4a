"""``botctl chat``: a terminal client of a running service, over the public HTTP API.

Interactive on a terminal: a prompt, the reply streamed token by token, then
one line of timings and cache use. Ctrl-C during a reply stops it (the turn is
cancelled on the server); Ctrl-C at the prompt clears the line; Ctrl-D exits.

A reply the service cut at its length limit (``finish_reason: "length"``) is
marked so on stderr, and the line ``/continue`` extends it
(``POST /v1/turns/{id}/continue``): the same reply goes on where it stopped.

Piped (stdin is not a terminal): one message per non-empty line, replies on
stdout one per line, the timing lines and errors on stderr, exit status 1 if a
reply failed. So ``botctl chat < questions.txt > answers.txt`` scripts well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, TextIO

import aiohttp
import click

DEFAULT_URL = "http://127.0.0.1:8080"
CONNECT_TIMEOUT_S = 10.0
PROMPT = "you> "
CONTINUE_COMMAND = "/continue"
CUT_MARK = f"[cut: the reply reached its length limit; {CONTINUE_COMMAND} goes on]"
NOTHING_TO_CONTINUE = "nothing to continue: no reply of this session was cut"


class ChatError(Exception):
    """A turn could not be sent or answered; ``fatal`` ones end the session (wrong key...)."""

    def __init__(self, error_class: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(f"{error_class}: {message}")
        self.error_class = error_class
        self.fatal = fatal


def stats_line(done: dict[str, Any]) -> str:
    """``[ttft 41 ms | 327 tok/s | total 324 ms | prompt 85 tok: 32 cached, 53 new | ...]``."""
    usage = done.get("usage") or {}
    timings = done.get("timings_ms") or {}
    parts = []
    if timings.get("ttft") is not None:
        parts.append(f"ttft {timings['ttft']:.0f} ms")
    completion = usage.get("completion_tokens") or 0
    decode = timings.get("decode") or 0
    if decode > 0 and completion > 1:
        # Decode time runs from the first token to the last: completion - 1 tokens.
        parts.append(f"{(completion - 1) * 1000 / decode:.0f} tok/s")
    if timings.get("e2e") is not None:
        parts.append(f"total {timings['e2e']:.0f} ms")
    prompt = usage.get("prompt_tokens") or 0
    cached = usage.get("cached_tokens") or 0
    parts.append(f"prompt {prompt} tok: {cached} cached, {prompt - cached} new")
    parts.append(f"{completion} generated")
    layers = ", ".join(
        f"{name} {timings[name]:.0f}"
        for name in ("queue", "prefill", "decode", "deliver")
        if timings.get(name) is not None
    )
    if layers:
        parts.append(f"{layers} ms")
    return "[" + " | ".join(parts) + "]"


async def _sse(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith(":"):
            continue  # a comment: the server's keep-alive
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
        elif "event" in fields and "data" in fields:
            yield fields["event"], json.loads(fields["data"])
            fields = {}


async def _refusal(response: aiohttp.ClientResponse) -> ChatError:
    try:
        document = await response.json(content_type=None)
    except (ValueError, aiohttp.ContentTypeError):
        document = {}
    error = str(document.get("error") or f"http_{response.status}")
    reason = str(document.get("reason") or response.reason or "")
    return ChatError(error, reason, fatal=response.status == 401)


class ChatSession:
    def __init__(self, url: str, key: str, conversation_id: str, out: TextIO, err: TextIO) -> None:
        self._url = url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {key}"}
        self.conversation_id = conversation_id
        self._out = out
        self._err = err
        self._http: aiohttp.ClientSession | None = None
        self.cut_turn_id: str | None = None
        """The last reply, when it was cut at the length limit: what ``/continue`` extends."""

    async def open(self) -> None:
        # No total timeout: a reply streams for as long as it takes.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
        self._http = aiohttp.ClientSession(timeout=timeout)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def turn(self, text: str) -> bool:
        """Send one message (or ``/continue``) and stream its reply; True when it completed."""
        if text.strip() == CONTINUE_COMMAND:
            if self.cut_turn_id is None:
                raise ChatError("usage", NOTHING_TO_CONTINUE)
            return await self._answer(f"/v1/turns/{self.cut_turn_id}/continue", None)
        body = {
            "conversation_id": self.conversation_id,
            "message_id": uuid.uuid4().hex,
            "text": text,
        }
        return await self._answer("/v1/messages", body)

    async def _answer(self, path: str, body: dict[str, Any] | None) -> bool:
        """POST ``path``, which answers 202 with the turn; stream that turn's reply."""
        assert self._http is not None
        try:
            async with self._http.post(
                f"{self._url}{path}", json=body, headers=self._auth
            ) as response:
                if response.status != 202:
                    raise await _refusal(response)
                accepted = await response.json()
        except aiohttp.ClientConnectionError as exc:
            raise ChatError(
                "network", f"cannot reach {self._url} ({type(exc).__name__}): is it running?"
            ) from exc
        self.cut_turn_id = None
        turn_id = str(accepted["turn_id"])
        try:
            return await self._stream(turn_id, str(accepted["stream_url"]))
        except asyncio.CancelledError:
            # Ctrl-C: stop the turn on the server too, not just our reading of it.
            await asyncio.shield(self._cancel(turn_id))
            self._out.write("\n")
            self._out.flush()
            self._err.write("[stopped]\n")
            self._err.flush()
            raise

    async def _stream(self, turn_id: str, stream_url: str) -> bool:
        assert self._http is not None
        headers = {**self._auth, "Accept": "text/event-stream"}
        async with self._http.get(f"{self._url}{stream_url}", headers=headers) as response:
            if response.status != 200:
                raise await _refusal(response)
            async for kind, data in _sse(response):
                if kind == "delta":
                    self._out.write(data["text"])
                    self._out.flush()
                elif kind == "done":
                    self._out.write("\n")
                    self._out.flush()
                    if data.get("finish_reason") == "length":
                        self.cut_turn_id = turn_id
                        self._err.write(CUT_MARK + "\n")
                    self._err.write(stats_line(data) + "\n")
                    self._err.flush()
                    return True
                elif kind == "error":
                    self._out.write("\n")
                    self._out.flush()
                    self._err.write(f"[{data.get('error_class')}] {data.get('message')}\n")
                    self._err.flush()
                    return False
        raise ChatError("network", f"the stream of turn {turn_id} ended early")

    async def _cancel(self, turn_id: str) -> None:
        assert self._http is not None
        try:
            async with self._http.post(
                f"{self._url}/v1/turns/{turn_id}/cancel", headers=self._auth
            ) as response:
                await response.read()
        except aiohttp.ClientError:
            pass  # the service went away: nothing left to stop


def _run_turn(loop: asyncio.AbstractEventLoop, session: ChatSession, text: str) -> bool:
    """Run one turn; Ctrl-C meanwhile cancels it (and only it)."""
    task = loop.create_task(session.turn(text))
    loop.add_signal_handler(signal.SIGINT, task.cancel)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        return False
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _interactive_lines(err: TextIO) -> Iterator[str]:
    with contextlib.suppress(ImportError):  # not on every platform
        import readline  # noqa: F401 - line editing and history for input()
    while True:
        try:
            line = input(PROMPT)
        except KeyboardInterrupt:
            err.write("\n")
            continue
        except EOFError:
            err.write("\n")
            return
        if line.strip():
            yield line


def _piped_lines(stream: TextIO) -> Iterator[str]:
    for line in stream:
        text = line.rstrip("\r\n")
        if text.strip():
            yield text


@click.command("chat")
@click.option(
    "--url",
    envvar="BOT_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Base URL of the service (or $BOT_URL).",
)
@click.option(
    "--key",
    envvar="BOT_API_KEY",
    help="API key (or $BOT_API_KEY, which keeps it out of `ps`); asked for when missing.",
)
@click.option(
    "--conversation", "conversation_id", help="Conversation id to continue (default: a new one)."
)
def chat(url: str, key: str | None, conversation_id: str | None) -> None:
    """Chat with a running service: interactive on a terminal, one message per line when piped."""
    interactive = sys.stdin.isatty()
    if not key:
        if not interactive:
            raise click.UsageError("no API key: pass --key or set BOT_API_KEY")
        key = click.prompt("API key", hide_input=True, err=True)
    conversation_id = conversation_id or f"cli-{uuid.uuid4().hex[:12]}"
    session = ChatSession(url, str(key), conversation_id, sys.stdout, sys.stderr)
    if interactive:
        click.echo(
            f"conversation {conversation_id} at {url} (Ctrl-C stops a reply, Ctrl-D exits, "
            f"{CONTINUE_COMMAND} extends a cut reply)",
            err=True,
        )
    lines = _interactive_lines(sys.stderr) if interactive else _piped_lines(sys.stdin)
    loop = asyncio.new_event_loop()
    failures = 0
    try:
        loop.run_until_complete(session.open())
        for text in lines:
            try:
                completed = _run_turn(loop, session, text)
            except ChatError as exc:
                click.echo(f"[{exc}]", err=True)
                if exc.fatal or not interactive:
                    raise SystemExit(1) from exc
                completed = False
            failures += not completed
    finally:
        loop.run_until_complete(session.close())
        loop.close()
    if failures and not interactive:
        raise SystemExit(1)
