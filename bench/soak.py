"""Soak: is every accepted message answered once, whatever fails?

Real ``botctl serve`` workers (one on SQLite, several on PostgreSQL) and one vLLM server
behind a fault proxy hold conversations on the four ways in (the API, Telegram, Slack, the
signed webhook; the platforms played by ``bot.testing``'s strict fakes) for ``--minutes``
while faults come at random: a share of the workers' database writes fail like a dropped
connection, another session locks the turns table (the SQLite file) longer than a write
waits, PostgreSQL connections are cut, engine streams are cut mid-reply and the engine is
gone for seconds, Telegram answers 5xx and 429, Slack ``ratelimited``, the webhook receiver
503 and 429, and a worker is SIGKILLed and started again. Then the faults and messages stop
and the workers get ``--settle-s``. Per channel: sent, accepted, done, failed, stuck
(accepted, never final), answered twice (two ``turn`` log lines, or more replies or failure
notices on the platform than messages sent there), ack p50 / p99. Exit status 1 when stuck
or answered twice is not 0.

Run:  .venv/bin/python bench/soak.py --database sqlite --minutes 1
      .venv/bin/python bench/soak.py --database postgres --workers 2 --minutes 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import harness
from aiohttp import web
from sqlalchemy import event, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from bot.errors import USER_MESSAGES
from bot.models.demo_model import build_demo_model
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import InboundEvent, Turn, TurnStatus
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from bot.testing.vllm_servers import free_port, launch, wait_ready
from bot.turns.claiming import INTERRUPTED_APOLOGY

CHANNELS = ("api", "telegram", "slack", "webhook")
LINES = [*harness.USER_LINES, "A NUL byte: a\u0000b, which PostgreSQL cannot store."]
NOTICES = frozenset({*USER_MESSAGES.values(), INTERRUPTED_APOLOGY})
"""What the service says instead of (or after) a reply."""
BURST_SHARE = 0.3
"""Share of later messages sent as two at once (the second queues behind the first)."""
DELIVERY_RETRY_FOR_S = 90.0
"""How long a message is delivered again (503, a dead worker) before it counts as refused."""
TURN_WAIT_S = 60.0
DB_LOCK_HOLD_S = 6.0
"""Longer than one attempt of a final write may wait (5 s)."""
WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
TELEGRAM_ERRORS = [(500, "Internal Server Error", None), (502, "Bad Gateway", None)]
TELEGRAM_ERRORS += [(429, "Too Many Requests: retry after 2", 2)]


@dataclass
class Sent:
    """One message sent, and what became of it."""

    channel: str
    chat: str
    """Where its answers show up (a chat, a thread, a conversation)."""
    event_id: str
    """The id the service deduplicates it on (``inbound_events``)."""
    turn_id: str | None = None
    accepted: bool = False
    ack_ms: float | None = None
    final: bool = False


# -- faults --------------------------------------------------------------------------------


def fail_writes_at_random(rate: float, seed: int, stop_file: Path) -> None:
    """In a worker: a share of its INSERTs, UPDATEs and DELETEs (the accept, the start, the
    partial replies, the final status, the leases, the takeover) raise what a dropped
    connection raises, until ``stop_file`` exists. On the ``Engine`` class: every engine the
    service builds gets it."""
    rng = random.Random(seed)

    def maybe_fail(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if WRITE.match(statement) and rng.random() < rate and not stop_file.exists():
            print(json.dumps({"event": "soak_db_fault"}), flush=True)
            raise OperationalError(statement, params, ConnectionResetError("injected fault"))

    event.listen(Engine, "before_cursor_execute", maybe_fail)


class EngineProxy:
    """A TCP proxy in front of vLLM that cuts each connection after a random amount of the
    server's output (a reply stops mid-stream), and can take the engine away."""

    def __init__(self, upstream_port: int, cut_every_kb: float, rng: random.Random) -> None:
        self._upstream_port, self._mean_budget, self._rng = upstream_port, cut_every_kb * 1024, rng
        self._writers: set[asyncio.StreamWriter] = set()
        self._down_until = 0.0
        self.port = self.cuts = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(server.sockets[0].getsockname()[1])
        return server

    def outage(self, seconds: float) -> None:
        """Live streams reset, new connections dropped for ``seconds``."""
        self._down_until = time.monotonic() + seconds
        for writer in list(self._writers):
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if time.monotonic() < self._down_until:
                raise OSError("the engine is down")
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        budget = self._rng.expovariate(1 / self._mean_budget) if self._mean_budget > 0 else None
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer, budget)
            )
        finally:
            self._writers.difference_update((writer, up_writer))
            for side in (writer, up_writer):
                side.transport.abort()

    async def _pipe(self, reader: Any, writer: Any, budget: float | None = None) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while data := await reader.read(16 * 1024):
                if budget is not None and sent + len(data) > budget:
                    writer.write(data[: max(0, int(budget) - sent)])  # part of it, then reset
                    self.cuts += 1
                    break
                writer.write(data)
                sent += len(data)
                await writer.drain()
        writer.transport.abort()


async def hold_lock(db_url: str) -> None:
    """Another session holds the turns table (PostgreSQL) or the database (SQLite)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":

        def hold() -> None:
            connection = sqlite3.connect(url.database or "", isolation_level=None, timeout=30)
            connection.execute("BEGIN EXCLUSIVE")
            time.sleep(DB_LOCK_HOLD_S)
            connection.close()

        await asyncio.to_thread(hold)
        return
    connection = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(False))
    try:
        async with connection.transaction():
            await connection.execute("LOCK TABLE turns IN ACCESS EXCLUSIVE MODE")
            await asyncio.sleep(DB_LOCK_HOLD_S)
    finally:
        await connection.close()


async def cut_connections(db_url: str) -> None:
    """Every other connection to the PostgreSQL database terminated."""
    url = make_url(db_url)
    admin = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(False))
    try:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            url.database,
        )
    finally:
        await admin.close()


class WebhookReceiver:
    """The integration's callback URL: answers 200, or ``failing`` more times 503 or 429."""

    def __init__(self) -> None:
        self.failing = 0
        self.delivered: dict[str, dict[str, Any]] = {}
        """Callbacks answered 2xx, by ``X-Webhook-Delivery`` (a retry is the same callback)."""
        self.app = web.Application()
        self.app.router.add_post("/hook", self._handle)

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.failing > 0:
            self.failing -= 1
            return web.Response(status=random.choice((503, 429)), headers={"Retry-After": "1"})
        self.delivered[request.headers.get("X-Webhook-Delivery", "")] = body
        return web.Response()


# -- the workers ---------------------------------------------------------------------------


class Workers:
    """``botctl serve`` processes (this file run with ``--worker``), killed and restarted."""

    def __init__(self, names: list[str], sections: dict[str, Any], env: dict[str, str], logs: Path):
        self._sections, self._env, self._logs = sections, env, logs
        self.ports = {name: free_port() for name in names}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.live: dict[str, str] = {}
        """Name -> base URL of the workers up now: where messages are delivered."""
        self.started = 0
        self.restarts: set[asyncio.Task[None]] = set()

    async def start(self, name: str) -> None:
        """Start ``name``, again while it exits at start (a locked database makes it do so)."""
        while True:
            self.started += 1
            port, log = self.ports[name], self._logs / f"{name}-{self.started}.log"
            server = self._sections["server"] | {"host": "127.0.0.1", "port": port}
            sections = self._sections | {"server": server}
            sections["workers"] = sections["workers"] | {"id": name}
            env = self._env | {"SOAK_DB_FAULT_SEED": str(self.started)}
            process = harness.start_botctl(
                sections, env, log, argv=[sys.executable, __file__, "--worker"]
            )
            self.processes[name] = process
            try:
                url = f"http://127.0.0.1:{port}"
                await asyncio.to_thread(harness.wait_until_up, process, f"{url}/healthz", log, 180)
                self.live[name] = url
                return
            except RuntimeError:
                await asyncio.sleep(1.0)

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL a live worker; start it again a moment later."""
        name = rng.choice(sorted(self.live))
        del self.live[name]
        os.killpg(self.processes[name].pid, signal.SIGKILL)
        self.processes[name].wait(10)

        async def restart() -> None:
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            await self.start(name)

        task = asyncio.create_task(restart())
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)

    async def all_up(self) -> None:
        await asyncio.gather(*self.restarts)
        await asyncio.gather(*(self.start(n) for n in self.ports if n not in self.live))

    async def stop(self) -> None:
        for task in self.restarts:
            task.cancel()
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


# -- the conversations ---------------------------------------------------------------------


async def deliver(
    http: aiohttp.ClientSession, workers: Workers, rng: random.Random, sent: Sent, request: Any
) -> None:
    """POST to a live worker until one answers 2xx, as a load balancer and the platforms'
    retries would; ``sent`` records the accepting attempt's ack time."""
    path, body, headers = request
    deadline = time.monotonic() + DELIVERY_RETRY_FOR_S
    for pause in itertools.chain((0.2, 0.5, 1.0), itertools.repeat(2.0)):
        if workers.live:
            started = time.perf_counter()
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.post(
                    rng.choice(sorted(workers.live.values())) + path,
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=15),
                ) as response:
                    answer = await response.text()
                    if response.status < 300:
                        sent.ack_ms, sent.accepted = (time.perf_counter() - started) * 1000, True
                        sent.turn_id = json.loads(answer).get("turn_id") if "{" in answer else None
                        return
                    if response.status < 500 and response.status != 429:
                        raise RuntimeError(f"{path} refused a message: {response.status}")
        if time.monotonic() + pause > deadline:
            return
        await asyncio.sleep(pause)


async def settled(sents: list[Sent], timeout_s: float) -> None:
    """Until every accepted one of ``sents`` is final (``Soak.follow`` reads them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(s.final for s in sents if s.accepted):  # noqa: ASYNC110
        await asyncio.sleep(0.25)


@dataclass
class Soak:
    """What the users, the fault injector and the report share."""

    args: argparse.Namespace
    key: str
    db_url: str
    workers: Workers
    proxy: EngineProxy
    telegram: FakeTelegram
    slack: FakeSlackApi
    receiver: WebhookReceiver
    http: aiohttp.ClientSession
    stop_at: float
    sents: list[Sent] = field(default_factory=list)
    status: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """Turn id -> (status, error class), as last read."""
    numbers: Iterator[int] = field(default_factory=itertools.count)

    def new_chat(self, channel: str) -> str:
        number = next(self.numbers)
        if channel == "telegram":
            return str(200_000_000 + number)
        if channel == "slack":  # the thread's root message ts
            return f"{int(time.time())}.{900_000 + number:06d}"
        return f"{channel}-c{number}"

    def message(
        self, channel: str, chat: str, index: int, text: str
    ) -> tuple[Sent, str, bytes, dict[str, str]]:
        """The chat's message ``index``, and the path, body and headers to deliver it with."""
        number = next(self.numbers)
        path, body, headers, event_id = harness.platform_request(
            channel, number, chat, text, self.key, root=index == 0
        )
        shown_in = f"{harness.SLACK_CHANNEL}:{chat}" if channel == "slack" else chat
        return Sent(channel, shown_in, event_id), path, body, headers

    def shown(self, channel: str) -> list[tuple[str, str]]:
        """(chat or webhook message id, text) of every message the bot left on the platform."""
        if channel == "telegram":
            calls = self.telegram.calls_of("sendMessage")
            return [(str(c.chat_id), str(c.params.get("text", ""))) for c in calls if c.ok]
        if channel == "slack":
            shown = []
            for call in self.slack.calls:
                if call.ok and call.method in ("chat.postMessage", "chat.startStream"):
                    channel_id, ts = str(call.args.get("channel")), str(call.response.get("ts"))
                    message = self.slack.messages.get((channel_id, ts))
                    chat = f"{channel_id}:{call.args.get('thread_ts')}"
                    shown.append((chat, message.text if message is not None else ""))
            return shown
        if channel == "webhook":
            return [
                (str(doc.get("in_reply_to")), str(doc.get("text") or doc.get("message") or ""))
                for doc in self.receiver.delivered.values()
                if doc.get("type") in ("final", "error")
            ]
        return []  # the API has no platform: its stream ends in the turn's final event

    async def follow(self) -> None:
        """Each accepted message's turn, and whether it is final (one engine for the run)."""
        db = create_engine(self.db_url)
        try:
            while True:
                with contextlib.suppress(Exception):  # the soak cuts this connection too
                    await self.read_turns(create_sessionmaker(db))
                await asyncio.sleep(0.5)
        finally:
            await db.dispose()

    async def read_turns(self, sessions: Any) -> None:
        pending = [s for s in self.sents if s.accepted and not s.final]
        async with sessions() as session:
            ids = [s.event_id for s in pending if s.turn_id is None]
            rows = await session.execute(
                select(InboundEvent.event_id, InboundEvent.turn_id).where(
                    InboundEvent.event_id.in_(ids)
                )
            )
            turn_of = {event_id: turn_id for event_id, turn_id in rows}
            for sent in pending:
                sent.turn_id = sent.turn_id or turn_of.get(sent.event_id)
            rows = await session.execute(
                select(Turn.id, Turn.status, Turn.error_class).where(
                    Turn.id.in_([s.turn_id for s in pending if s.turn_id])
                )
            )
            self.status.update((turn_id, (state, error)) for turn_id, state, error in rows)
        for sent in pending:
            sent.final = self.status.get(sent.turn_id or "", ("",))[0] in TurnStatus.FINAL

    async def converse(self, channel: str, rng: random.Random) -> None:
        """One user of the channel: conversations of a few turns until the run stops, each
        message once the last one's turn is final (or ``TURN_WAIT_S`` passed)."""
        while time.monotonic() < self.stop_at:
            chat = self.new_chat(channel)
            for index in range(self.args.turns_per_conversation):
                if time.monotonic() >= self.stop_at:
                    return
                mine = []
                for _ in range(2 if index and rng.random() < BURST_SHARE else 1):
                    text = rng.choice(LINES)
                    sent, *request = self.message(channel, chat, index, text)
                    self.sents.append(sent)
                    mine.append(sent)
                    await deliver(self.http, self.workers, rng, sent, request)
                await settled(mine, TURN_WAIT_S)
                await asyncio.sleep(rng.uniform(0.2, 1.0))

    async def inject_faults(self, rng: random.Random) -> Counter[str]:
        """Once a second, each kind of fault fires with the chance that gives its mean interval."""
        args, faults = self.args, Counter[str]()
        background: set[asyncio.Task[Any]] = set()

        def chance(mean_interval_s: float) -> bool:
            return mean_interval_s > 0 and rng.random() < args.fault_scale / mean_interval_s

        def later(name: str, make: Callable[[], Awaitable[Any]]) -> None:
            async def run() -> None:
                with contextlib.suppress(Exception):  # its own connection cut by another fault
                    await make()

            faults[name] += 1
            background.add(asyncio.create_task(run()))

        telegram, slack = self.telegram, self.slack
        while time.monotonic() < self.stop_at:
            await asyncio.sleep(1.0)
            if chance(args.kill_every_s) and len(self.workers.live) == len(self.workers.ports):
                self.workers.kill_one(rng)
                faults["worker_sigkill"] += 1
            if chance(8):
                method = rng.choice(["sendMessage", "sendMessageDraft", "sendChatAction"])
                code, text, wait = rng.choice(TELEGRAM_ERRORS)
                times = rng.randint(1, 3)
                telegram.fail(code, text, method=method, times=times, retry_after=wait)
                faults[f"telegram_{code}"] += times
            if chance(15):
                method = rng.choice(["chat.postMessage", "chat.startStream", "chat.appendStream"])
                slack.fail(method, "ratelimited", retry_after=1)
                faults["slack_429"] += 1
            if chance(12):
                self.receiver.failing += (times := rng.randint(1, 4))
                faults["webhook_receiver_503_429"] += times
            if chance(args.engine_outage_every_s):
                self.proxy.outage(rng.uniform(2.0, 5.0))
                faults["engine_outage"] += 1
            if chance(args.db_lock_every_s):
                later("db_lock", lambda: hold_lock(self.db_url))
            if chance(args.db_cut_every_s) and not self.db_url.startswith("sqlite"):
                later("db_connections_cut", lambda: cut_connections(self.db_url))
        await asyncio.gather(*background)
        return faults


# -- the run -------------------------------------------------------------------------------


def report(soak: Soak, faults: Counter[str], logs: Path) -> int:
    lines = []
    for raw in itertools.chain(
        *(p.read_text(errors="replace").splitlines() for p in logs.glob("w*.log"))
    ):
        with contextlib.suppress(ValueError):
            lines.append(json.loads(raw) if raw.startswith("{") else {})
    turn_lines = Counter(line.get("turn_id") for line in lines if line.get("event") == "turn")
    faults["db_write_errors"] = sum(1 for line in lines if line.get("event") == "soak_db_fault")
    print("faults: " + ", ".join(f"{name} {n}" for name, n in sorted(faults.items())))
    print("channel   sent  accepted  done  failed  stuck  twice  ack_p50_ms  ack_p99_ms")
    failed_by: Counter[str] = Counter()
    stuck = twice = 0
    for channel in CHANNELS:
        mine = [s for s in soak.sents if s.channel == channel]
        accepted = [s for s in mine if s.accepted]
        turn_ids = [s.turn_id for s in accepted if s.turn_id in soak.status]
        states = [soak.status[turn_id][0] for turn_id in turn_ids]
        failed_by.update(
            str(error)
            for state, error in map(soak.status.get, turn_ids)
            if state == TurnStatus.FAILED
        )
        # Replies and failure notices per chat (a Telegram chat, a Slack thread, a webhook
        # message): more of either than messages sent there is an answer given twice.
        answers: Counter[tuple[str, str]] = Counter()
        for chat, text in soak.shown(channel):
            answers[chat, "notice" if any(n in text for n in NOTICES) else "reply"] += 1
        per_chat = Counter(s.event_id if channel == "webhook" else s.chat for s in accepted)
        doubled = sum(max(0, n - per_chat[chat]) for (chat, _), n in answers.items())
        doubled += sum(1 for s in accepted if turn_lines[s.turn_id] > 1)
        not_final = sum(1 for s in accepted if not s.final)
        stuck, twice = stuck + not_final, twice + doubled
        acks = [s.ack_ms for s in accepted if s.ack_ms is not None]
        print(
            f"{channel:<8} {len(mine):>5}  {len(accepted):>8}  "
            f"{states.count(TurnStatus.DONE):>4}  {states.count(TurnStatus.FAILED):>6}  "
            f"{not_final:>5}  {doubled:>5}  {harness.percentile(acks, 50):>10.1f}  "
            f"{harness.percentile(acks, 99):>10.1f}"
        )
    by_class = ", ".join(f"{error} {n}" for error, n in failed_by.most_common()) or "none"
    print(f"failed by error class: {by_class}")
    refused = sum(1 for s in soak.sents if not s.accepted)
    print(f"not accepted (every delivery refused for {DELIVERY_RETRY_FOR_S:.0f} s): {refused}")
    print(f"stuck (accepted, not final {soak.args.settle_s:g} s after the run): {stuck}")
    print(f"answered twice: {twice}")
    return 1 if stuck or twice else 0


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    print(f"# logs in {workdir}", flush=True)
    model = build_demo_model(Path(args.model_dir))
    server = launch(model, workdir, core=0)
    postgres = harness.POSTGRES if args.database == "postgres" else None
    # Replies paced faster than the real platforms allow, so that a minute holds many turns.
    telegram = FakeTelegram(flood_interval_private_s=0.02, flood_interval_group_s=0.04)
    slack, receiver, stop_file = FakeSlackApi(), WebhookReceiver(), workdir / "faults-stop"
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(server.stop)
        db_url = await stack.enter_async_context(harness.scratch_database(workdir, postgres))
        key = await harness.bench_key(db_url, "soak")
        await asyncio.to_thread(wait_ready, server, time.monotonic())
        proxy = EngineProxy(server.port, args.engine_cut_every_kb, random.Random(args.seed))
        proxy_server = await proxy.start()
        stack.callback(proxy_server.close)
        urls = await harness.open_platforms(telegram, slack)
        stack.push_async_callback(harness.close_platforms, telegram, slack)
        runner, receiver_url = await harness.serve_on_loopback(receiver.app)
        stack.push_async_callback(runner.cleanup)
        engine = server.engine_section() | {"model": str(model), "request_timeout_s": 30}
        engine |= {"base_urls": [f"http://127.0.0.1:{proxy.port}"], "breaker_cooldown_s": 2}
        paced = {"private_min_interval_s": 0.08, "group_min_interval_s": 0.16}
        hook = {"callback_url": f"{receiver_url}/hook", "allow_http_callback": True}
        hook |= {"chunk_interval_s": 0.05, "retry_backoff_s": 0.2, "retry_for_s": 10.0}
        slack_paced = {"stream_interval_s": 0.05, "update_interval_s": 0.05}
        sections = harness.service_sections(db_url, engine, args.max_tokens) | {
            "server": {"shutdown_grace_s": 5},
            "workers": {"lease_s": 3, "poll_interval_s": 0.3, "watchdog_grace_s": 3},
            "tenancy": {"cache_salt_secret": "soak-cache-salt-secret"},
            "logging": {"level": "INFO", "format": "json"},  # the `turn` lines are counted
            "telegram": [harness.telegram_bot(urls["telegram"], max_flood_wait_s=5.0, **paced)],
            "slack": [harness.slack_app(urls["slack"], post_interval_s=0.05, **slack_paced)],
            "webhooks": [harness.WEBHOOK | hook],
        }
        env = {"PYTHONUNBUFFERED": "1", "SOAK_DB_FAULT_RATE": str(args.db_fault_rate)}
        env["SOAK_DB_FAULT_STOP"] = str(stop_file)
        names = [f"w{i + 1}" for i in range(1 if postgres is None else args.workers)]
        workers = Workers(names, sections, env, workdir)
        stack.push_async_callback(workers.stop)
        await asyncio.gather(*(workers.start(name) for name in names))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        stop_at = time.monotonic() + args.minutes * 60
        soak = Soak(args, key, db_url, workers, proxy, telegram, slack, receiver, http, stop_at)
        follower = asyncio.create_task(soak.follow())
        users = [
            soak.converse(channel, random.Random(rng.random()))
            for channel in CHANNELS
            for _ in range(args.users_per_channel)
        ]
        faults, *_ = await asyncio.gather(soak.inject_faults(rng), *users)
        # The run is over: no more faults, every worker back, then time to settle.
        stop_file.touch()
        telegram._rules.clear()
        slack._failures.clear()
        receiver.failing = 0
        await workers.all_up()
        await settled(soak.sents, args.settle_s)
        await asyncio.sleep(2.0)  # the last platform calls land
        follower.cancel()
        print(
            f"# soak: {args.database}, {len(names)} worker(s), {args.minutes:g} min of messages,"
            f" settle {args.settle_s:g} s; demo model on one vLLM server behind a fault proxy"
        )
        faults.update(engine_streams_cut=proxy.cuts)
        return report(soak, faults, workdir)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--workers", type=int, default=2, help="PostgreSQL only")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--users-per-channel", type=int, default=2)
    parser.add_argument("--turns-per-conversation", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--settle-s", type=float, default=60.0)
    parser.add_argument("--db-fault-rate", type=float, default=0.01, help="share of writes")
    parser.add_argument("--db-lock-every-s", type=float, default=45.0)
    parser.add_argument("--db-cut-every-s", type=float, default=50.0)
    parser.add_argument("--engine-cut-every-kb", type=float, default=300.0)
    parser.add_argument("--engine-outage-every-s", type=float, default=40.0)
    parser.add_argument("--kill-every-s", type=float, default=40.0)
    parser.add_argument("--fault-scale", type=float, default=1.0, help="x every fault rate")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model-dir", default=str(harness.DEMO_MODEL_DIR))
    return parser.parse_args()


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        from bot.cli import main as botctl

        fail_writes_at_random(
            float(os.environ["SOAK_DB_FAULT_RATE"]),
            int(os.environ["SOAK_DB_FAULT_SEED"]),
            Path(os.environ["SOAK_DB_FAULT_STOP"]),
        )
        botctl.main(args=["serve"], prog_name="botctl")
    else:
        sys.exit(asyncio.run(main(parse_args())))
