"""Soak: conversations on every channel while things fail at random; every message must end once.

Runs the real service as ``botctl serve`` worker processes (one on SQLite,
several on PostgreSQL) in front of one real vLLM OpenAI server (the demo
model), with the platforms played by the test suite's strict fakes: HTTP API
clients, Telegram private chats, Slack threads and a signed webhook
integration hold conversations for ``--minutes`` while faults are injected at
random:

* database: a share of the workers' writes fail like a dropped connection
  (bench/soak_worker.py), another session locks the turns table (or the
  SQLite file) for longer than a write may wait, and on PostgreSQL every
  connection is cut now and then (a database restart as the workers see it);
* engine: a TCP proxy in front of vLLM cuts streams mid-reply and takes the
  engine away for a few seconds (bench/soak_faults.py);
* platforms: Telegram 5xx and 429 flood waits, Slack 503 and ``ratelimited``,
  the webhook receiver answering 503/429;
* workers: one is SIGKILLed now and then and started again (same worker id).

Then the faults stop, the messages stop, and the soak waits ``--settle-s``
for the accepted messages to end. It prints, per channel: accepted, done,
failed (and by error class), the ack latency (p50/p99); then stuck
(accepted, not final after the settle time), answered twice (a platform
message that got two replies or two failure notices, or a turn with two
``turn`` log lines) and the faults it injected. Exit status 1 when stuck or
answered twice is not 0.

Run:  .venv/bin/python bench/soak.py --database sqlite --minutes 1
      .venv/bin/python bench/soak.py --database postgres --workers 2 --minutes 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import asyncpg
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import percentile
from platform_requests import (
    SLACK_BOT_USER,
    SLACK_TEAM,
    SLACK_TOKEN,
    SLACK_USER,
    TELEGRAM_TOKEN,
    TELEGRAM_USERNAME,
    slack_app,
    telegram_bot,
)
from soak_faults import EngineProxy, cut_connections, hold_lock
from soak_platforms import (
    DELIVERY_RETRY_FOR_S,
    WEBHOOK_NAME,
    WEBHOOK_SECRET,
    ApiPlayer,
    Finals,
    FlakySlack,
    FlakyTelegram,
    Sent,
    SlackPlayer,
    TelegramPlayer,
    WebhookPlayer,
    WebhookReceiver,
    Workers,
    count_finals,
)

from bot.apikeys import create_key
from bot.models.demo_model import build_demo_model
from bot.ops.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.migrate import upgrade
from bot.storage.models import InboundEvent, Turn, TurnStatus
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, free_port, launch, wait_ready

POSTGRES_ADMIN_DSN = os.environ.get(
    "BOT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
USER_LINES = [
    "Hello! How are you today?",
    "Tell me about the weather in Paris this week.",
    "And what about London and Berlin?",
    "Please answer briefly and politely.",
    "Code: def main(): return print('hello world')",
    "Markdown: **bold**, _italic_, `code`.",
    "A NUL byte: a\u0000b, which PostgreSQL cannot store.",
]
BURST_SHARE = 0.3
"""Share of API and webhook sends that are two messages at once (the second queues)."""
TURN_WAIT_S = 60.0
"""How long a sender waits for a turn to end before it writes again anyway."""
ANSWER_WAIT_S = 10.0
"""Telegram and Slack: how long a sender waits to see the answer of its last message."""
QUIET_S = 1.5
POLL_S = 0.5
LEASE_S = 3.0
WATCHDOG_GRACE_S = 3.0
WORKER_START_TIMEOUT_S = 180.0
DB_LOCK_HOLD_S = 6.0
"""Longer than one attempt of a final write may wait (5 s)."""


# -- the database's view -------------------------------------------------------------


class TurnOracle:
    """Follows the turns of the accepted messages in the database (one query per poll)."""

    def __init__(self, db_url: str) -> None:
        self._engine = create_engine(db_url)
        self._sessions = create_sessionmaker(self._engine)
        self.sents: list[Sent] = []
        self.status: dict[str, tuple[str, str | None]] = {}
        """turn id -> (status, error class)"""

    async def close(self) -> None:
        await self._engine.dispose()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # the soak cuts this connection too
                await self.poll()
            await asyncio.sleep(POLL_S)

    async def poll(self) -> None:
        pending = [s for s in self.sents if s.accepted and not s.final]
        unresolved = [s for s in pending if s.turn_id is None]
        async with self._sessions() as session:
            if unresolved:
                ids = [s.event_id for s in unresolved]
                rows = await session.execute(
                    select(InboundEvent.event_id, InboundEvent.turn_id).where(
                        InboundEvent.event_id.in_(ids)
                    )
                )
                turn_of = {event_id: turn_id for event_id, turn_id in rows}
                for sent in unresolved:
                    sent.turn_id = turn_of.get(sent.event_id)
            turn_ids = [s.turn_id for s in pending if s.turn_id is not None]
            if turn_ids:
                states = await session.execute(
                    select(Turn.id, Turn.status, Turn.error_class).where(Turn.id.in_(turn_ids))
                )
                for turn_id, status, error_class in states:
                    self.status[turn_id] = (status, error_class)
        for sent in pending:
            if sent.turn_id and self.status.get(sent.turn_id, ("",))[0] in TurnStatus.FINAL:
                sent.final = True

    async def wait_final(self, sents: list[Sent], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        # The poller updates them.
        while time.monotonic() < deadline and not all(s.final for s in sents if s.accepted):  # noqa: ASYNC110
            await asyncio.sleep(POLL_S / 2)


# -- workers ---------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    port: int
    process: subprocess.Popen[bytes] | None = None
    incarnation: int = 0


class WorkerPool:
    """``botctl serve`` processes (through bench/soak_worker.py), killed and restarted at will."""

    def __init__(self, names: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.workers = {name: Worker(name, free_port()) for name in names}
        self._env = env
        self._log_dir = log_dir
        self.live = Workers()
        self.kills = 0
        self.failed_starts: list[str] = []
        self.restarts: set[asyncio.Task[None]] = set()

    def _spawn(self, worker: Worker) -> None:
        worker.incarnation += 1
        log_path = self._log_dir / f"{worker.name}-{worker.incarnation}.log"
        env = {
            **self._env,
            "BOT_SERVER__PORT": str(worker.port),
            "BOT_WORKERS__ID": worker.name,
            "SOAK_DB_FAULT_SEED": str(zlib.crc32(f"{worker.name}-{worker.incarnation}".encode())),
        }
        with log_path.open("wb") as log:
            worker.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("soak_worker.py"))],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    async def start(self, worker: Worker) -> None:
        self._spawn(worker)
        url = f"http://127.0.0.1:{worker.port}"
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                assert worker.process is not None
                if worker.process.poll() is not None:
                    log = self._log_dir / f"{worker.name}-{worker.incarnation}.log"
                    raise RuntimeError(f"worker {worker.name} exited at start: see {log}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{url}/healthz") as response:
                        if response.status == 200:
                            self.live.urls[worker.name] = url
                            return
                await asyncio.sleep(0.2)
        raise RuntimeError(f"worker {worker.name} not up in {WORKER_START_TIMEOUT_S} s")

    async def start_until_up(self, worker: Worker) -> None:
        """Start ``worker``, again if it exits at start (a locked database makes it do that)."""
        while True:
            try:
                await self.start(worker)
                return
            except RuntimeError as exc:
                self.failed_starts.append(str(exc))
                await asyncio.sleep(1.0)

    async def start_all(self) -> None:
        await asyncio.gather(*(self.start(worker) for worker in self.workers.values()))

    def kill_one(self, rng: random.Random, restart_after_s: float) -> str:
        """SIGKILL a live worker and start it again later; returns its name."""
        names = sorted(self.live.urls)
        worker = self.workers[rng.choice(names)]
        self.live.urls.pop(worker.name, None)
        assert worker.process is not None
        os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait(10)
        self.kills += 1

        async def restart() -> None:
            await asyncio.sleep(restart_after_s)
            await self.start_until_up(worker)

        task = asyncio.create_task(restart())
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)
        return worker.name

    async def stop_all(self) -> None:
        for task in list(self.restarts):
            with contextlib.suppress(Exception):
                await task
        for worker in self.workers.values():
            if worker.process is not None and worker.process.poll() is None:
                os.killpg(worker.process.pid, signal.SIGTERM)
        for worker in self.workers.values():
            if worker.process is None:
                continue
            try:
                await asyncio.to_thread(worker.process.wait, 30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.process.pid, signal.SIGKILL)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for path in sorted(self._log_dir.glob("w*.log")):
            for raw in path.read_text(errors="replace").splitlines():
                if raw.startswith("{"):
                    with contextlib.suppress(ValueError):
                        lines.append(json.loads(raw))
        return lines


# -- conversations -------------------------------------------------------------------


class Player(Protocol):
    channel: str
    one_at_a_time: bool

    async def send(
        self, rng: random.Random, conversation: str, message_id: str, text: str
    ) -> Sent: ...

    def finals(self, sents: list[Sent]) -> dict[str, Finals]: ...


async def quiet(last_answer: Callable[[], float | None]) -> None:
    """Wait until the chat has its answer and nothing more came for ``QUIET_S``.

    An apology can follow a final row (a turn taken over is failed first, then
    apologised for): the chat's next message must not be sent before it lands,
    or the apology would be counted as that message's answer.
    """
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        last = last_answer()
        if last is not None and time.monotonic() - last >= QUIET_S:
            return
        await asyncio.sleep(0.1)


async def converse(
    player: Player,
    new_conversation: Callable[[], str],
    rng: random.Random,
    stop_at: float,
    oracle: TurnOracle,
    turns_per_conversation: int,
) -> None:
    """One user of the channel: conversations of a few turns until the run stops."""
    while time.monotonic() < stop_at:
        conversation = new_conversation()
        for index in range(turns_per_conversation):
            if time.monotonic() >= stop_at:
                return
            burst = 2 if not player.one_at_a_time and rng.random() < BURST_SHARE else 1
            sents = []
            for part in range(burst):
                # Unique per integration (the webhook deduplicates on it alone).
                message_id = f"{conversation}-{index}" + (f"-{part}" if burst > 1 else "")
                if player.channel == "slack" and index == 0:
                    message_id = ""  # the thread's root
                sent = await player.send(rng, conversation, message_id, rng.choice(USER_LINES))
                oracle.sents.append(sent)
                sents.append(sent)
            await oracle.wait_final(sents, TURN_WAIT_S)
            last_answer = getattr(player, "last_answer", None)
            if last_answer is not None:
                await quiet(functools.partial(last_answer, sents[-1]))
            await asyncio.sleep(rng.uniform(0.2, 1.0))


# -- faults ----------------------------------------------------------------------------


class FaultLog:
    """How many of each fault, and when: ``faults.log`` beside the workers' logs, to match them."""

    def __init__(self, path: Path) -> None:
        self.counts: Counter[str] = Counter()
        self._path = path

    def record(self, name: str, times: int = 1, **details: Any) -> None:
        self.counts[name] += times
        line = {"timestamp": dt.datetime.now(dt.UTC).isoformat(), "fault": name, "times": times}
        with self._path.open("a", encoding="utf-8") as log:
            log.write(json.dumps({**line, **details}) + "\n")


async def inject_faults(
    args: argparse.Namespace,
    rng: random.Random,
    stop_at: float,
    pool: WorkerPool,
    proxy: EngineProxy,
    telegram: FlakyTelegram,
    slack: FlakySlack,
    receiver: WebhookReceiver,
    db_url: str,
    faults: FaultLog,
) -> None:
    """Once a second, each kind of fault fires with the chance that gives its mean interval."""
    background: set[asyncio.Task[Any]] = set()
    scale = args.fault_scale

    def chance(mean_interval_s: float) -> bool:
        return mean_interval_s > 0 and rng.random() < scale / mean_interval_s

    def later(make: Callable[[], Awaitable[Any]]) -> None:
        async def run() -> None:
            with contextlib.suppress(Exception):  # e.g. its own connection cut by another fault
                await make()

        task = asyncio.create_task(run())
        background.add(task)
        task.add_done_callback(background.discard)

    while time.monotonic() < stop_at:
        await asyncio.sleep(1.0)
        if chance(args.kill_every_s) and len(pool.live.urls) == len(pool.workers):
            killed = pool.kill_one(rng, restart_after_s=rng.uniform(0.5, 3.0))
            faults.record("worker_sigkill", worker=killed)
        if chance(15):
            times = rng.randint(1, 3)
            code, text = rng.choice([(500, "Internal Server Error"), (502, "Bad Gateway")])
            method = rng.choice(["sendMessage", "sendMessageDraft", "sendChatAction"])
            telegram.fail(code, text, method=method, times=times)
            faults.record("telegram_5xx", times, method=method, status=code)
        if chance(15):
            chats = sorted({c.chat_id for c in telegram.calls[-50:] if isinstance(c.chat_id, int)})
            if chats:
                chat, wait = rng.choice(chats), rng.randint(1, 3)
                telegram.inject_flood(chat, retry_after=wait)
                faults.record("telegram_429", chat_id=chat, retry_after=wait)
        if chance(15):
            times = rng.randint(1, 3)
            slack.failing += times
            faults.record("slack_503", times)
        if chance(15):
            method = rng.choice(["chat.postMessage", "chat.startStream", "chat.appendStream"])
            slack.fail(method, "ratelimited", retry_after=1)
            faults.record("slack_429", method=method)
        if chance(12):
            times = rng.randint(1, 4)
            receiver.failing += times
            faults.record("webhook_receiver_503_429", times)
        if chance(args.engine_outage_every_s):
            seconds = rng.uniform(2.0, 5.0)
            proxy.outage(seconds)
            faults.record("engine_outage", seconds=round(seconds, 1))
        if chance(args.db_lock_every_s):
            faults.record("db_lock", seconds=DB_LOCK_HOLD_S)
            later(lambda: hold_lock(db_url, DB_LOCK_HOLD_S))
        if chance(args.db_cut_every_s) and not db_url.startswith("sqlite"):
            faults.record("db_connections_cut")
            later(lambda: cut_connections(db_url))
    for task in list(background):
        with contextlib.suppress(Exception):
            await task


# -- set-up ----------------------------------------------------------------------------


async def make_database(kind: str, workdir: Path) -> tuple[str, str | None]:
    """A fresh database: (URL, PostgreSQL database name to drop afterwards)."""
    if kind == "sqlite":
        return f"sqlite+aiosqlite:///{workdir / 'soak.db'}", None
    name = f"soak_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
    return f"{base}/{name}", name


async def drop_database(name: str) -> None:
    admin = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def worker_env(
    args: argparse.Namespace,
    db_url: str,
    model: Path,
    engine_url: str,
    telegram: FlakyTelegram,
    slack: FlakySlack,
    receiver: WebhookReceiver,
    stop_file: Path,
) -> dict[str, str]:
    bots = [
        telegram_bot(
            telegram.base_url,
            private_min_interval_s=0.08,
            group_min_interval_s=0.16,
            typing_refresh_s=0.5,
            max_flood_wait_s=5.0,
        )
    ]
    apps = [
        slack_app(
            slack.base_url, stream_interval_s=0.05, update_interval_s=0.05, post_interval_s=0.05
        )
    ]
    hooks = [
        {
            "name": WEBHOOK_NAME,
            "secret": WEBHOOK_SECRET,
            "callback_url": receiver.url,
            # The strict fake receiver listens on loopback, over plain http.
            "allow_http_callback": True,
            "chunk_interval_s": 0.05,
            "retry_backoff_s": 0.2,
            "retry_for_s": 10.0,
        }
    ]
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",  # a SIGKILLed worker keeps every line it wrote
        "BOT_DATABASE__URL": db_url,
        "BOT_SERVER__SHUTDOWN_GRACE_S": "5",
        "BOT_ENGINE__KIND": "openai",
        "BOT_ENGINE__MODEL": str(model),
        "BOT_ENGINE__MAX_MODEL_LEN": "1024",
        "BOT_ENGINE__BASE_URLS": json.dumps([engine_url]),
        "BOT_ENGINE__API_KEY": API_KEY,
        "BOT_ENGINE__SERVED_MODEL_NAME": SERVED_MODEL_NAME,
        "BOT_ENGINE__REQUEST_TIMEOUT_S": "30",
        "BOT_ENGINE__BREAKER_COOLDOWN_S": "2",
        "BOT_GENERATION__MAX_TOKENS": str(args.max_tokens),
        "BOT_WORKERS__LEASE_S": str(LEASE_S),
        "BOT_WORKERS__POLL_INTERVAL_S": "0.3",
        "BOT_WORKERS__WATCHDOG_GRACE_S": str(WATCHDOG_GRACE_S),
        "BOT_LIMITS__MESSAGES_PER_MINUTE": "0",
        "BOT_LIMITS__TOKENS_PER_DAY": "0",
        "BOT_TENANCY__CACHE_SALT_SECRET": "soak-cache-salt-secret",
        "BOT_LOGGING__FORMAT": "json",
        "BOT_LOGGING__LEVEL": "INFO",
        "BOT_TELEGRAM": json.dumps(bots),
        "BOT_SLACK": json.dumps(apps),
        "BOT_WEBHOOKS": json.dumps(hooks),
        "SOAK_DB_FAULT_RATE": str(args.db_fault_rate),
        "SOAK_DB_FAULT_AFTER_S": "0",
        "SOAK_DB_FAULT_STOP": str(stop_file),
    }


# -- report ----------------------------------------------------------------------------


def describe(sent: Sent, shown: Finals | None, turn_lines: int, oracle: TurnOracle) -> str:
    """One message answered twice: what the platform showed, when, and the turn's end."""
    status, error_class = oracle.status.get(sent.turn_id or "", ("?", None))
    answers = [
        f"+{max(0.0, at - sent.posted_at):.1f}s {text[:60]!r}"
        for at, text in (shown.shown if shown else [])
    ]
    return (
        f"{sent.channel} {sent.chat} event {sent.event_id} turn {sent.turn_id} "
        f"{status}/{error_class} turn lines {turn_lines}: " + "; ".join(answers)
    )


def report(
    args: argparse.Namespace,
    players: list[Player],
    oracle: TurnOracle,
    pool: WorkerPool,
    proxy: EngineProxy,
    faults: FaultLog,
    elapsed_s: float,
) -> int:
    lines = pool.log_lines()
    turn_lines = Counter(e["turn_id"] for e in lines if e.get("event") == "turn" and "turn_id" in e)
    db_faults = sum(1 for e in lines if e.get("event") == "soak_db_fault")
    workers = len(pool.workers)
    print(
        f"# soak: {args.database}, {workers} worker(s), {elapsed_s / 60:.1f} min of messages, "
        f"settle {args.settle_s:.0f} s; demo model on one vLLM server behind a fault proxy, CPU"
    )
    injected = {
        "db_write_errors": db_faults,
        "engine_streams_cut": proxy.cuts,
        **faults.counts,
    }
    print("faults: " + ", ".join(f"{name} {n}" for name, n in sorted(injected.items())))
    print("channel   sent  accepted  done  failed  stuck  twice  ack_p50_ms  ack_p99_ms")
    total: Counter[str] = Counter()
    failed_by: Counter[str] = Counter()
    reply_then_notice = no_answer = 0
    anomalies: list[str] = []
    for player in players:
        sents = [s for s in oracle.sents if s.channel == player.channel]
        accepted = [s for s in sents if s.accepted]
        states = [oracle.status.get(s.turn_id or "", ("", None)) for s in accepted]
        done = sum(1 for status, _ in states if status == TurnStatus.DONE)
        failed = [error for status, error in states if status == TurnStatus.FAILED]
        failed_by.update(f"{error}" for error in failed)
        stuck = sum(1 for s in accepted if not s.final)
        found = player.finals(accepted) if accepted else {}
        finals = count_finals(found)
        doubled = sum(1 for s in accepted if turn_lines.get(s.turn_id or "", 0) > 1)
        for sent in accepted:
            shown = found.get(sent.event_id)
            lines_of_turn = turn_lines.get(sent.turn_id or "", 0)
            if (shown and (shown.replies > 1 or shown.notices > 1)) or lines_of_turn > 1:
                anomalies.append(describe(sent, shown, lines_of_turn, oracle))
        twice = finals["twice"] + doubled
        reply_then_notice += finals["reply_then_notice"]
        no_answer += finals["none"] if player.channel != "api" else 0
        acks = [s.ack_ms for s in accepted if s.ack_ms is not None]
        total.update(sent=len(sents), accepted=len(accepted), stuck=stuck, twice=twice, done=done)
        print(
            f"{player.channel:<8} {len(sents):>5}  {len(accepted):>8}  {done:>4}  "
            f"{len(failed):>6}  {stuck:>5}  {twice:>5}  {percentile(acks, 50):>10.1f}  "
            f"{percentile(acks, 99):>10.1f}"
        )
    missing_lines = sum(
        1
        for s in oracle.sents
        if s.accepted and s.final and turn_lines.get(s.turn_id or "", 0) == 0
    )
    by_class = ", ".join(f"{name} {n}" for name, n in failed_by.most_common()) or "none"
    print(f"failed by error class: {by_class}")
    refused = total["sent"] - total["accepted"]
    print(f"not accepted (every delivery refused for {DELIVERY_RETRY_FOR_S:.0f} s): {refused}")
    stuck = total["stuck"]
    print(f"stuck (accepted, not final {args.settle_s:.0f} s after the run stopped): {stuck}")
    print(f"answered twice: {total['twice']}")
    for anomaly in anomalies:
        print("  " + anomaly)
    print(
        f"a reply (or part of one), then a failure notice: {reply_then_notice}; "
        f"no answer on the platform at all (its API failed the reply and the apology): "
        f"{no_answer}"
    )
    print(f"final turns without a `turn` log line: {missing_lines}")
    for failure in pool.failed_starts:
        print(f"a worker failed to start (started again): {failure}")
    return 1 if total["stuck"] or total["twice"] else 0


# -- main ------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> int:
    configure_logging("WARNING", "json")
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    print(f"# logs in {workdir}", flush=True)
    model = build_demo_model(Path(args.model_dir))
    db_url, pg_name = await make_database(args.database, workdir)
    await asyncio.to_thread(upgrade, db_url)
    db = create_engine(db_url)
    async with create_sessionmaker(db)() as session, session.begin():
        key = (await create_key(session, name="soak")).key
    await db.dispose()

    server = launch(model, workdir, core=0)
    await asyncio.to_thread(wait_ready, server, time.monotonic())
    proxy = EngineProxy(server.port, cut_every_kb=args.engine_cut_every_kb, seed=args.seed)
    await proxy.start()
    telegram = FlakyTelegram(flood_interval_private_s=0.02, flood_interval_group_s=0.04)
    slack = FlakySlack()
    receiver = WebhookReceiver(rng)
    oracle = TurnOracle(db_url)
    stop_file = workdir / "faults-stop"
    names = ["w1"] if args.database == "sqlite" else [f"w{i + 1}" for i in range(args.workers)]
    pool: WorkerPool | None = None
    try:
        await telegram.__aenter__()
        telegram.add_bot(TELEGRAM_TOKEN, TELEGRAM_USERNAME)
        slack.add_workspace(SLACK_TOKEN, SLACK_TEAM, bot_user_id=SLACK_BOT_USER)
        slack.add_user(SLACK_TEAM, SLACK_USER, display_name="Alice")
        await slack.start()
        await receiver.start()
        env = worker_env(
            args,
            db_url,
            model,
            f"http://127.0.0.1:{proxy.port}",
            telegram,
            slack,
            receiver,
            stop_file,
        )
        pool = WorkerPool(names, env, workdir)
        await pool.start_all()
        faults = FaultLog(workdir / "faults.log")
        async with aiohttp.ClientSession() as http:
            players: list[Player] = [
                ApiPlayer(http, pool.live, key),
                TelegramPlayer(http, pool.live, telegram),
                SlackPlayer(http, pool.live, slack),
                WebhookPlayer(http, pool.live, receiver),
            ]
            numbers = iter(range(1, 1_000_000))

            def conversation_of(channel: str) -> Callable[[], str]:
                def new() -> str:
                    n = next(numbers)
                    if channel == "telegram":
                        return str(200_000_000 + n)
                    if channel == "slack":
                        return f"{int(time.time())}.{900_000 + n:06d}"
                    return f"{channel}-c{n}"

                return new

            poller = asyncio.create_task(oracle.run())
            started = time.monotonic()
            stop_at = started + args.minutes * 60
            users = [
                converse(
                    player,
                    conversation_of(player.channel),
                    random.Random(rng.random()),
                    stop_at,
                    oracle,
                    args.turns_per_conversation,
                )
                for player in players
                for _ in range(args.users_per_channel)
            ]
            injecting = inject_faults(
                args, rng, stop_at, pool, proxy, telegram, slack, receiver, db_url, faults
            )
            await asyncio.gather(injecting, *users)
            elapsed = time.monotonic() - started
            # The run is over: no more faults, every worker back, then time to settle.
            stop_file.touch()
            for platform in (telegram, slack, receiver):
                platform.calm()
            for task in list(pool.restarts):
                await task
            for worker in pool.workers.values():
                if worker.name not in pool.live.urls:
                    await pool.start_until_up(worker)
            await oracle.wait_final(oracle.sents, args.settle_s)
            await asyncio.sleep(2.0)  # the last platform calls land
            await oracle.poll()
            poller.cancel()
            return report(args, players, oracle, pool, proxy, faults, elapsed)
    finally:
        if pool is not None:
            await pool.stop_all()
        await oracle.close()
        await receiver.close()
        await slack.close()
        await telegram.__aexit__(None, None, None)
        await proxy.close()
        server.stop()
        if pg_name is not None and not args.keep_db:
            await drop_database(pg_name)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    parser.add_argument("--model-dir", default="data/demo-model")
    parser.add_argument("--keep-db", action="store_true", help="keep the PostgreSQL database")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
