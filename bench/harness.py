"""What the benchmarks share: the model and settings they serve, a scratch database, the app
on a loopback port, an API key, the prefix-cache share, a client process, the loop's lag, a
``botctl serve`` process, and a message as each platform delivers it (built from the
channels' real payload fixtures) with the identities the service is configured with.

Benchmarks import it as a sibling module (``from harness import ...``): a script's own
folder is first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Self

import asyncpg
from aiohttp import web
from slack_sdk.signature import SignatureVerifier
from sqlalchemy.engine import make_url

from bot.apikeys import create_key
from bot.channels.webhook.signing import signed_headers
from bot.engine.base import GenerationRequest
from bot.models.demo_model import build_demo_model
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.migrate import upgrade
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram

REPO = Path(__file__).resolve().parents[1]
DEMO_MODEL_DIR = REPO / "data" / "demo-model"
"""Where the demo model is built once (ignored by git, as ``make model`` builds it)."""
BLOCK_SIZE = 32
"""The KV cache's block: only full blocks are cached, so only full blocks count as cacheable."""
NO_LIMITS = {"messages_per_minute": 0, "tokens_per_day": 0}
"""A benchmark is one key sending many messages: fair use would throttle it."""
POSTGRES = os.environ.get("BOT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
"""The local PostgreSQL server (trust auth), as the tests use it."""
USER_LINES = [
    "Hello! How are you today?",
    "Tell me about the weather in Paris this week.",
    "And what about London and Berlin?",
    "Please answer briefly and politely.",
    "What can I do for you? Numbers: 1 2 3 100.",
    "Code: def main(): return print('hello world')",
    "Markdown: **bold**, _italic_, `code`.",
    "Questions and answers, greetings and farewells.",
    "Ünïcödé and émojis 🙂 — café?",
    "Thanks, that is all.",
]


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` (a prepared folder) or the demo model, built in ``--model-dir``."""
    parser.add_argument("--model-dir", default=str(DEMO_MODEL_DIR), help="the demo model's folder")
    parser.add_argument("--model", help="a prepared model instead, e.g. data/smollm2")


def served_model(args: argparse.Namespace) -> tuple[Path, str]:
    """The model folder ``add_model_arguments`` chose, and its engine dtype."""
    if args.model:
        return Path(args.model), "auto"
    # float32: the demo model's reference figures are taken so.
    return build_demo_model(Path(args.model_dir)), "float32"


def model_name(args: argparse.Namespace) -> str:
    return str(args.model or "demo model")


def service_sections(db_url: str, engine: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The settings' sections a benchmark serves with: greedy replies, no fair-use limits."""
    return {
        "database": {"url": db_url},
        "engine": engine,
        "generation": {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0},
        "logging": {"level": "WARNING", "format": "json"},
        "limits": NO_LIMITS,
    }


def local_engine(model: Path, dtype: str) -> dict[str, Any]:
    """The ``[engine]`` section of the in-process engine for ``served_model``'s model."""
    return {"model": str(model), "dtype": dtype, "max_model_len": 4096, "block_size": BLOCK_SIZE}


def greedy(prompt: list[int], max_tokens: int, **extra: Any) -> GenerationRequest:
    """A request for ``prompt`` as the benchmarks send one: greedy, so runs compare."""
    return GenerationRequest(
        request_id=uuid.uuid4().hex,
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        top_p=1.0,
        **extra,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def prefix_reuse(chats: Sequence[Sequence[tuple[int, int, int]]]) -> tuple[int, int]:
    """(cached, cacheable) prompt tokens over turns 2.. of each chat's (prompt, completion,
    cached) tokens a turn: cacheable is the previous prompt + reply's full blocks (the KV of
    a reply's last token is never computed), and a turn's cached tokens count up to that."""
    cached = cacheable = 0
    for chat in chats:
        for (prompt, completion, _), (_, _, hit) in itertools.pairwise(chat):
            full = (prompt + completion - 1) // BLOCK_SIZE * BLOCK_SIZE
            cacheable += full
            cached += min(hit, full)
    return cached, cacheable


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on a free 127.0.0.1 port; the runner (to clean up) and the base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def bench_key(db_url: str, name: str, owner: str | None = None) -> str:
    """A fresh API key (the secret) for the benchmark's client."""
    db = create_engine(db_url)
    try:
        async with create_sessionmaker(db)() as session, session.begin():
            return (await create_key(session, name=name, owner=owner)).key
    finally:
        await db.dispose()


@contextlib.asynccontextmanager
async def scratch_database(workdir: Path, server: str | None) -> AsyncIterator[str]:
    """A new, migrated database for one run: SQLite in ``workdir``, or on ``server``.

    ``server`` is a PostgreSQL URL (any driver named in it): the run gets a database of its
    own there, dropped afterwards, so that no earlier run's rows (queued turns of a run cut
    short) are in its way and it leaves none behind.
    """
    if server is None:
        url = f"sqlite+aiosqlite:///{workdir / 'bench.db'}"
        await asyncio.to_thread(upgrade, url)
        yield url
        return
    parsed = make_url(server)
    admin_dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"bench_{uuid.uuid4().hex[:12]}"

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect(admin_dsn)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    await admin(f'CREATE DATABASE "{name}"')
    try:
        url = parsed.set(drivername="postgresql+asyncpg", database=name)
        await asyncio.to_thread(upgrade, url.render_as_string(hide_password=False))
        yield url.render_as_string(hide_password=False)
    finally:
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class LoopLag:
    """How late the event loop runs a timer, sampled every ``every_s``: a handler waits at
    least this long before it starts. Slow acks with a prompt loop wait elsewhere."""

    def __init__(self, every_s: float = 0.005) -> None:
        self._every_s = every_s
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._every_s
            await asyncio.sleep(self._every_s)
            self.samples_ms.append((loop.time() - due) * 1000)

    def start(self) -> None:
        self.samples_ms = []
        self._task = asyncio.create_task(self._sample())

    def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
        return self.samples_ms


class JsonLinesProcess:
    """A benchmark's client run as a process of its own: ``python SCRIPT ARGS...``.

    Run on the service's own event loop, a client's building, parsing and timing of
    requests would compete with the server for that loop and count as the service's time.
    One JSON line on its stdin per request, one JSON line back (``answer_json_lines``);
    end of stdin ends it. Secrets go in ``env``, not on the command line.
    """

    def __init__(self, script: str, args: list[str], env: dict[str, str]) -> None:
        self._command = [sys.executable, str(Path(script).resolve()), *args]
        self._env = {**os.environ, **env}
        self._process: asyncio.subprocess.Process | None = None

    async def ask(self, request: Any) -> Any:
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request).encode() + b"\n")
        await process.stdin.drain()
        line = await process.stdout.readline()
        if not line:
            raise RuntimeError(f"{Path(self._command[1]).name} exited ({await process.wait()})")
        return json.loads(line)

    async def __aenter__(self) -> Self:
        self._process = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self._env,
            limit=2**26,  # one answer is one line: thousands of arrivals' acks
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # end of the requests: the client cleans up and exits
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def answer_json_lines(answer: Callable[[Any], Awaitable[Any]]) -> None:
    """The client process's side of ``JsonLinesProcess``: one answer line per request line."""
    while line := await asyncio.to_thread(sys.stdin.readline):
        sys.stdout.write(json.dumps(await answer(json.loads(line))) + "\n")
        sys.stdout.flush()


def start_botctl(
    sections: dict[str, Any],
    env: dict[str, str],
    log_path: Path,
    new_session: bool = True,
    argv: Sequence[str] = (sys.executable, "-m", "bot.cli", "serve"),
) -> subprocess.Popen[bytes]:
    """A real ``botctl serve`` (or ``argv`` that runs it) with these settings' sections (each
    as JSON in the environment, as pydantic-settings reads them), by default in a session of
    its own (a process group to kill; with autogroup, a scheduling group of its own too)."""
    sections_env = {f"BOT_{name.upper()}": json.dumps(value) for name, value in sections.items()}
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(argv),
            env={**os.environ, **sections_env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )


def wait_until_up(
    process: subprocess.Popen[bytes], url: str, log_path: Path, timeout_s: float
) -> None:
    """Until ``url`` answers 200; RuntimeError if the process exits or times out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"botctl serve exited ({process.returncode}): see {log_path}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"botctl serve not up in {timeout_s:g} s: see {log_path}")


# -- a message as each platform delivers it ------------------------------------------------

TELEGRAM_BOT = "benchbot"
TELEGRAM_TOKEN = "7000000001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
TELEGRAM_USERNAME = "BenchBot"
TELEGRAM_SECRET = "bench-Secret_header"
SLACK_TOKEN = "xoxb-bench-0001"
SLACK_TEAM = "T0001TEAM"
SLACK_BOT_USER = "UBOT0001"
SLACK_USER = "U0001ALICE"
SLACK_CHANNEL = "C0001BENCH"
SLACK_SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
WEBHOOK = {"name": "bench", "secret": "bench-webhook-secret-0123456789"}
JSON = {"Content-Type": "application/json"}


@cache
def fixture(channel: str, name: str) -> dict[str, Any]:
    """A platform's real payload, as the channel's tests keep it (JSON data, not code)."""
    loaded: dict[str, Any] = json.loads((REPO / "tests" / channel / "fixtures" / name).read_text())
    return loaded


def platform_request(
    channel: str, number: int, chat: str, text: str, key: str = "", root: bool = False
) -> tuple[str, bytes, dict[str, str], str]:
    """Message ``number`` (unique in the run) to ``chat`` as ``channel`` delivers it: the
    path, body and headers to POST, and the id the service deduplicates it on. ``chat`` is a
    Telegram private chat's id, a Slack thread's root ts in ``SLACK_CHANNEL`` (``root``: this
    message is that root), or a conversation id (the API with ``key``, the generic webhook)."""
    now = int(time.time())
    if channel == "telegram":
        update = copy.deepcopy(fixture("telegram", "private_text.json"))
        update["update_id"] = update_id = 600_000_000 + number
        message = update["message"]
        message.update(message_id=number, text=text, date=now)
        message["chat"]["id"] = message["from"]["id"] = int(chat)
        headers = {"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET, **JSON}
        return f"/telegram/{TELEGRAM_BOT}", json.dumps(update).encode(), headers, str(update_id)
    if channel == "slack":
        body = copy.deepcopy(fixture("slack", "app_mention.json"))
        body.update(event_id=(event_id := f"Ev{number:08d}"), event_time=now)
        event, ts = body["event"], chat if root else f"{now}.{number:06d}"
        event.update(ts=ts, event_ts=ts, channel=SLACK_CHANNEL, user=SLACK_USER)
        event["text"] = f"<@{SLACK_BOT_USER}> {text}"
        event.pop("blocks", None)
        if not root:
            event["thread_ts"] = chat
        raw = json.dumps(body).encode()
        signature = SignatureVerifier(SLACK_SIGNING_SECRET).generate_signature(
            timestamp=str(now), body=raw.decode()
        )
        headers = {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": signature or ""}
        return "/slack/events", raw, headers | JSON, event_id
    message_id = f"{chat}-m{number}"
    body = json.dumps({"conversation_id": chat, "message_id": message_id, "text": text}).encode()
    if channel == "webhook":
        headers = signed_headers(WEBHOOK["secret"], body)
        return f"/webhooks/{WEBHOOK['name']}", body, headers, message_id
    return "/v1/messages", body, {"Authorization": f"Bearer {key}", **JSON}, message_id


def telegram_bot(api_base_url: str, **overrides: Any) -> dict[str, Any]:
    """The ``[[telegram]]`` entry of the bot these updates are for."""
    return {
        "name": TELEGRAM_BOT,
        "token": TELEGRAM_TOKEN,
        "secret_token": TELEGRAM_SECRET,
        "api_base_url": api_base_url,
        "username": TELEGRAM_USERNAME,
        **overrides,
    }


def slack_app(api_base_url: str, **overrides: Any) -> dict[str, Any]:
    """The ``[[slack]]`` entry of the app these events are for."""
    return {
        "name": "main",
        "signing_secret": SLACK_SIGNING_SECRET,
        "bot_token": SLACK_TOKEN,
        "api_base_url": api_base_url,
        "app_id": "A0001APP",
        **overrides,
    }


async def open_platforms(telegram: FakeTelegram, slack: FakeSlackApi) -> dict[str, str]:
    """The strict fakes started with the bot, the workspace and its user; their base URLs."""
    await telegram.__aenter__()
    telegram.add_bot(TELEGRAM_TOKEN, TELEGRAM_USERNAME)
    slack.add_workspace(SLACK_TOKEN, SLACK_TEAM, bot_user_id=SLACK_BOT_USER)
    slack.add_user(SLACK_TEAM, SLACK_USER, display_name="Alice")
    return {"telegram": telegram.base_url, "slack": await slack.start()}


async def close_platforms(telegram: FakeTelegram, slack: FakeSlackApi) -> None:
    await slack.close()
    await telegram.__aexit__(None, None, None)
