"""``botctl chat`` as a user runs it: a real process against the real app on loopback.

Piped mode through stdin/stdout, interactive mode through a pseudo-terminal
(the stdlib ``pty``), where Ctrl-C is a real SIGINT from the terminal.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import sys
import time
from typing import Any

import pytest

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.helpers import auth
from tests.ops.slow_engine import SlowEngine

STATS = re.compile(
    r"\[ttft \d+ ms \| .*prompt (\d+) tok: (\d+) cached, (\d+) new \| (\d+) generated"
)
# The child takes the pty as its controlling terminal, so Ctrl-C there sends it SIGINT.
WITH_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, '-m', 'bot.cli', 'chat', *sys.argv[1:]])"
)


def _env(key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BOT_API_KEY", "BOT_URL")}
    if key:
        env["BOT_API_KEY"] = key
    env["TERM"] = "dumb"
    return env


async def _piped(url: str, key: str | None, stdin: str, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot.cli",
        "chat",
        "--url",
        url,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(key),
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def _turns(client: Any, key: str, conversation: str) -> list[dict[str, Any]]:
    await client.app[TURNS].wait_idle(timeout=30)
    response = await client.get(f"/v1/conversations/{conversation}/turns", headers=auth(key))
    return list((await response.json())["turns"])


async def test_piped_mode_answers_one_message_per_line(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    code, out, err = await _piped(
        str(client.make_url("")), key, "Hello there\n\n  \nHow are you?\n", "--conversation", "p1"
    )
    assert code == 0, err
    turns = await _turns(client, key, "p1")
    assert [t["text"] for t in turns] == ["Hello there", "How are you?"]
    # stdout is exactly the replies, one after the other; the timings go to stderr.
    assert out == "".join(t["reply"] + "\n" for t in turns)
    stats = [STATS.search(line) for line in err.splitlines()]
    found = [m for m in stats if m]
    assert len(found) == 2, err
    prompt, cached, new, generated = map(int, found[1].groups())
    assert cached > 0 and new == prompt - cached  # turn 2 re-read turn 1 from the cache
    assert generated == turns[1]["usage"]["completion_tokens"]


async def test_piped_mode_fails_clearly(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url)
    code, out, err = await _piped(str(client.make_url("")), "bot_wrong_key", "Hi\n")
    assert code == 1 and out == "" and "auth" in err
    code, _, err = await _piped(str(client.make_url("")), None, "Hi\n")
    assert code == 2 and "BOT_API_KEY" in err
    code, _, err = await _piped("http://127.0.0.1:9", "bot_x_y", "Hi\n")  # nothing listens there
    assert code == 1 and "network" in err and "is it running?" in err


async def test_a_reply_cut_at_the_length_limit_is_marked(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url, generation={"max_tokens": 4})
    key = await issue_key(sqlite_url)
    # /continue before anything was cut is refused, and sends nothing.
    code, _, err = await _piped(
        str(client.make_url("")), key, "/continue\n", "--conversation", "k1"
    )
    assert code == 1 and "nothing to continue" in err
    code, out, err = await _piped(
        str(client.make_url("")), key, "Tell me everything\n", "--conversation", "k1"
    )
    assert code == 0, err
    [turn] = await _turns(client, key, "k1")
    assert turn["finish_reason"] == "length"
    assert out == turn["reply"] + "\n", "the mark is not part of the reply"
    assert "[cut: the reply reached its length limit; /continue goes on]" in err


def _routes(client: Any) -> set[str]:
    return {str(route.resource.canonical) for route in client.app.router.routes() if route.resource}


async def test_continue_extends_the_cut_reply(sqlite_url: str, make_client: MakeClient) -> None:
    client = await make_client(sqlite_url, generation={"max_tokens": 16})
    if "/v1/turns/{turn_id}/continue" not in _routes(client):
        pytest.skip("the service has no POST /v1/turns/{id}/continue to extend a reply with")
    key = await issue_key(sqlite_url)
    code, out, err = await _piped(
        str(client.make_url("")), key, "Tell me everything\n/continue\n", "--conversation", "k2"
    )
    assert code == 0, err
    [turn] = await _turns(client, key, "k2")  # the active branch: the continued reply
    cut_url = f"/v1/turns/{turn['continues_turn_id']}"
    cut = await (await client.get(cut_url, headers=auth(key))).json()
    assert cut["finish_reason"] == "length"
    assert turn["usage"]["completion_tokens"] > 0  # it generated more
    assert turn["reply"].startswith(cut["reply"])
    # The cut reply, then only what the continuation added: together, the whole reply.
    assert out == cut["reply"] + "\n" + turn["reply"][len(cut["reply"]) :] + "\n"
    assert "[cut:" in err


class Terminal:
    """The master side of a pseudo-terminal, read without blocking the event loop."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.output = ""
        self._changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.fd)
        self.output += data.decode(errors="replace")
        self._changed.set()

    async def expect(self, pattern: str, start: int = 0, within_s: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + within_s
        while (match := re.compile(pattern).search(self.output, start)) is None:
            self._changed.clear()
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {pattern!r} in terminal output:\n{self.output[start:]}"
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                continue
        return match

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.fd)
        os.close(self.fd)


async def test_interactive_mode_streams_and_ctrl_c_cancels_the_turn(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    slow = SlowEngine(engine, delay_s=0.0)
    client = await make_client(sqlite_url, engine_override=slow, generation={"max_tokens": 200})
    key = await issue_key(sqlite_url)
    master, slave = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WITH_TERMINAL,
        "--url",
        str(client.make_url("")),
        "--conversation",
        "tty1",
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        env=_env(key),
    )
    os.close(slave)
    terminal = Terminal(master)
    try:
        await terminal.expect(r"conversation tty1 .*Ctrl-D exits")
        await terminal.expect("you> ")
        terminal.type("Hello there\n")
        first = await terminal.expect(r"\[ttft \d+ ms[^\]]*\]")
        await terminal.expect("you> ", first.end())

        # A reply that takes seconds: stop it once it has started to stream. The delay is
        # per token: vLLM merges the steps a slow reader has not taken, so a pause per step
        # let the 200 tokens arrive in about a second on a loaded machine, before the Ctrl-C.
        slow.delay_s = 0.05
        terminal.type("Tell me a long story\n")
        echoed = await terminal.expect(r"Tell me a long story\r?\n", first.end())
        await terminal.expect(r"\S", echoed.end())
        terminal.type("\x03")
        stopped = await terminal.expect(r"\[stopped\]", echoed.end(), within_s=10)
        await terminal.expect("you> ", stopped.end())

        # Ctrl-C at the prompt only clears the line; Ctrl-D leaves.
        terminal.type("half a line\x03")
        await terminal.expect("you> ", stopped.end() + 5)
        terminal.type("\x04")
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        terminal.close()

    turns = await _turns(client, key, "tty1")
    assert [t["status"] for t in turns] == ["done", "stopped"]
    assert turns[1]["error_class"] == "cancelled"
    assert turns[0]["reply"] and turns[0]["reply"].replace("\n", "\r\n") in terminal.output
    assert turns[1]["usage"]["completion_tokens"] < 200  # stopped well before the end
