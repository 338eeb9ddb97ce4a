"""Two real ``botctl serve`` workers on one fresh PostgreSQL, in front of the two vLLM servers.

Concurrent posts to the same and to different conversations, alternating
between the workers, and Telegram group messages; one worker is SIGKILLed
while it generates. Every accepted message must end ``done`` with exactly one
final reply, turns of a conversation in order, none generated twice: the turns
the dead worker was generating are continued by the other (docs/replies.md),
their SSE readers reconnect there and get the rest, their Telegram messages
go on being edited.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.models import Message, Turn, TurnStatus, as_utc, utcnow
from bot.testing.telegram_api import FakeTelegram
from bot.testing.vllm_servers import API_KEY, SERVED_MODEL_NAME, VLLMServer, free_port
from tests.conftest import issue_key, migrate
from tests.helpers import auth, load_turns

pytestmark = pytest.mark.postgres
LEASE_S = 3.0
TELEGRAM_TOKEN = "7000000001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
TELEGRAM_SECRET = "workers-Secret_header"
TELEGRAM_USERNAME = "TestChatBot"
FIXTURES = Path(__file__).parent.parent / "telegram" / "fixtures"


@dataclass
class Worker:
    name: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    continue
        return lines


def worker_env(
    db_url: str,
    name: str,
    port: int,
    servers: list[VLLMServer],
    model: Path,
    telegram_url: str | None = None,
) -> dict[str, str]:
    telegram = []
    if telegram_url is not None:
        telegram = [
            {
                "name": "tg",
                "token": TELEGRAM_TOKEN,
                "secret_token": TELEGRAM_SECRET,
                "api_base_url": telegram_url,
                "username": TELEGRAM_USERNAME,
            }
        ]
    return {
        "BOT_TELEGRAM": json.dumps(telegram),
        **os.environ,
        "BOT_DATABASE__URL": db_url,
        "BOT_SERVER__PORT": str(port),
        "BOT_SERVER__SHUTDOWN_GRACE_S": "2",
        "BOT_ENGINE__KIND": "openai",
        "BOT_ENGINE__MODEL": str(model),
        "BOT_ENGINE__MAX_MODEL_LEN": "1024",
        "BOT_ENGINE__BASE_URLS": json.dumps([s.base_url for s in servers if not s.killed]),
        "BOT_ENGINE__API_KEY": API_KEY,
        "BOT_ENGINE__SERVED_MODEL_NAME": SERVED_MODEL_NAME,
        "BOT_GENERATION__MAX_TOKENS": "96",
        "BOT_GENERATION__TEMPERATURE": "0",
        "BOT_WORKERS__ID": name,
        "BOT_WORKERS__LEASE_S": str(LEASE_S),
        "BOT_WORKERS__POLL_INTERVAL_S": "0.3",
        "BOT_LOGGING__FORMAT": "json",
    }


def start_worker(name: str, env: dict[str, str], log_dir: Path) -> Worker:
    port = int(env["BOT_SERVER__PORT"])
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Worker(name, port, log_path, process)


async def wait_healthy(worker: Worker, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert worker.process.poll() is None, worker.log_path.read_text()[-3000:]
            try:
                async with http.get(f"{worker.url}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"{worker.name} did not start:\n{worker.log_path.read_text()[-3000:]}")


@pytest.fixture
def stop_workers() -> Iterator[list[Worker]]:
    workers: list[Worker] = []
    yield workers
    for worker in workers:
        if worker.process.poll() is None:
            os.killpg(worker.process.pid, signal.SIGTERM)
            try:
                worker.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(worker.process.pid, signal.SIGKILL)


async def messages_per_turn(db_url: str) -> Counter[str]:
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            ids = (await session.scalars(select(Message.turn_id))).all()
    finally:
        await engine.dispose()
    return Counter(turn_id for turn_id in ids if turn_id)


async def test_two_workers_answer_every_message_exactly_once_even_when_one_is_killed(
    pg_url: str,
    vllm_servers: list[VLLMServer],
    demo_model_dir: Path,
    tmp_path: Path,
    stop_workers: list[Worker],
) -> None:
    key = await issue_key(pg_url)
    async with FakeTelegram() as telegram:
        telegram.add_bot(TELEGRAM_TOKEN, TELEGRAM_USERNAME)
        await killed_mid_run(
            pg_url, key, vllm_servers, demo_model_dir, tmp_path, stop_workers, telegram
        )


def group_mention(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    update: dict[str, Any] = json.loads((FIXTURES / "group_mention.json").read_text())
    update["update_id"] = update_id
    message = update["message"]
    message.update(message_id=update_id % 100_000, date=int(time.time()))
    message["chat"]["id"] = chat_id
    message["text"] = f"@{TELEGRAM_USERNAME} {text}"
    message["entities"] = [{"offset": 0, "length": len(TELEGRAM_USERNAME) + 1, "type": "mention"}]
    return update


async def follow(
    http: aiohttp.ClientSession, workers: list[Worker], key: str, turn_id: str
) -> tuple[str, str, int]:
    """Read a turn's events from the first worker, and on from the second with
    ``Last-Event-ID`` when the first goes away: (the deltas' text, the final event's text,
    how many connections it took)."""
    text, last_id = "", "0"
    for connections, worker in enumerate(itertools.cycle(workers), start=1):
        headers = {**auth(key), "Last-Event-ID": last_id}
        kind, data, event_id = "", "", last_id
        try:
            async with http.get(
                f"{worker.url}/v1/turns/{turn_id}/events",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=180),
            ) as response:
                assert response.status == 200, await response.text()
                async for raw in response.content:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("id: "):
                        event_id = line[4:]
                    elif line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif not line and kind:
                        payload = json.loads(data)
                        if kind == "delta":
                            text += payload["text"]
                            last_id = event_id
                        else:
                            assert kind == "done", (kind, payload)
                            return text, payload["text"], connections
                        kind = ""
        except (aiohttp.ClientError, ConnectionError):
            pass
        await asyncio.sleep(0.2)
        assert connections < 20, f"{turn_id}: no end after {connections} connections"
    raise AssertionError("unreachable")


async def killed_mid_run(
    pg_url: str,
    key: str,
    vllm_servers: list[VLLMServer],
    demo_model_dir: Path,
    tmp_path: Path,
    stop_workers: list[Worker],
    telegram: FakeTelegram,
) -> None:
    workers = [
        start_worker(
            name,
            worker_env(pg_url, name, free_port(), vllm_servers, demo_model_dir, telegram.base_url),
            tmp_path,
        )
        for name in ("w1", "w2")
    ]
    stop_workers.extend(workers)
    await asyncio.gather(*(wait_healthy(worker) for worker in workers))

    conversations = [f"conv-{i}" for i in range(4)]
    posts = [(conv, turn) for turn in range(3) for conv in conversations]

    async def post(http: aiohttp.ClientSession, index: int, conv: str, turn: int) -> str:
        worker = workers[index % 2]  # the same conversation lands on both workers
        async with http.post(
            f"{worker.url}/v1/messages",
            json={
                "conversation_id": conv,
                "message_id": f"m{turn}",
                "text": f"{conv} message {turn}",
            },
            headers=auth(key),
        ) as response:
            assert response.status == 202, await response.text()
            return str((await response.json())["turn_id"])

    chats = [-1009000000001 - i for i in range(4)]

    async def mention(http: aiohttp.ClientSession, index: int, chat_id: int) -> None:
        update = group_mention(700000 + index, chat_id, f"tell me about rivers, {index}")
        async with http.post(
            f"{workers[0].url}/telegram/tg",
            json=update,
            headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
        ) as response:
            assert response.status == 200, await response.text()

    http = aiohttp.ClientSession()
    accepted = await asyncio.gather(
        *(post(http, i, conv, turn) for i, (conv, turn) in enumerate(posts))
    )
    await asyncio.gather(*(mention(http, i, chat) for i, chat in enumerate(chats)))
    # A redelivery to the *other* worker is the same turn (dedupe holds across workers).
    again = await post(http, 1, posts[0][0], posts[0][1])
    assert again == accepted[0]
    # Every reply is read as it streams, from w1 first (SSE): its readers reconnect to w2.
    readers = [asyncio.create_task(follow(http, workers, key, turn_id)) for turn_id in accepted]

    # SIGKILL w1 while it is generating a reply. One connection polls the turns: a turn
    # takes some 0.4 s, about what opening a connection per look took on a busy machine.
    victim = workers[0]
    deadline = time.monotonic() + 60
    watcher = create_engine(pg_url)
    interrupted: list[str] = []

    async def running_in_w1(session: AsyncSession) -> list[str]:
        running = await session.scalars(
            select(Turn.id).where(Turn.status == TurnStatus.RUNNING, Turn.lease_owner == "w1")
        )
        await session.rollback()  # a fresh snapshot next time
        return list(running)

    try:
        async with create_sessionmaker(watcher)() as session:
            while not interrupted and time.monotonic() < deadline:
                if not await running_in_w1(session):
                    await asyncio.sleep(0.01)
                    continue
                # Frozen, w1 changes nothing more: the turn seen running may have ended
                # meanwhile (its final write already sent), so look again once what w1 had
                # sent has reached the server, and kill it only in the middle of a turn.
                victim.process.send_signal(signal.SIGSTOP)
                stopped_at = utcnow()
                await asyncio.sleep(0.2)
                interrupted = await running_in_w1(session)
                if not interrupted:
                    victim.process.send_signal(signal.SIGCONT)  # between two turns: again
    finally:
        await watcher.dispose()
    if not interrupted:
        # Rare on CI, never seen here: say where every turn ran and what w1 logged.
        ran = sorted((t.lease_owner or "-", t.status, t.seq) for t in await load_turns(pg_url))
        events = Counter(line.get("event") for line in victim.log_lines())
        raise AssertionError(f"w1 never ran a turn: turns {ran}; w1 logged {dict(events)}")
    # w2 takes none over before the lease ends.
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)

    # w2 takes over once w1's lease runs out, and finishes everything.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        turns = await load_turns(pg_url)
        if all(t.status in TurnStatus.FINAL for t in turns):
            break
        await asyncio.sleep(0.3)
    turns = await load_turns(pg_url)
    by_id = {t.id: t for t in turns}
    api_turns = {t.id: t for t in turns if t.channel == "api"}
    assert sorted(api_turns) == sorted(set(accepted)), "one turn per accepted message"
    assert len(turns) == len(api_turns) + len(chats)
    assert all(t.status in TurnStatus.FINAL for t in turns), [(t.id, t.status) for t in turns]

    # Nothing failed: the turns w1 was generating were continued by w2.
    failed = [(t.id, t.error_message) for t in turns if t.status == TurnStatus.FAILED]
    assert failed == []
    assert all(by_id[turn_id].resumes == 1 for turn_id in interrupted), [
        (turn_id, by_id[turn_id].resumes) for turn_id in interrupted
    ]

    # Every SSE reader got each reply once and whole, across the reconnect.
    followed = await asyncio.gather(*readers)
    await http.close()
    for turn_id, (streamed, final_text, _) in zip(accepted, followed, strict=True):
        assert streamed == final_text == by_id[turn_id].reply_text, turn_id
    assert any(connections > 1 for _, _, connections in followed), "no reader reconnected"

    # Every Telegram chat shows one reply message, edited as it grew, never sent again.
    for chat_id in chats:
        sends = [c for c in telegram.calls_of("sendMessage", chat_id) if c.ok]
        assert len(sends) == 1, (chat_id, [c.params.get("text") for c in sends])
        (shown,) = telegram.messages(chat_id)
        assert shown.text.strip(), chat_id

    # History: exactly one user + one assistant entry per answered turn.
    stored = await messages_per_turn(pg_url)
    for turn in turns:
        assert stored.get(turn.id, 0) == (2 if turn.status == TurnStatus.DONE else 0), turn.id

    # Order within each conversation: a turn starts only after the previous one ended.
    for conv_id in {t.conversation_id for t in turns}:
        ordered = sorted((t for t in turns if t.conversation_id == conv_id), key=lambda t: t.seq)
        for previous, current in itertools.pairwise(ordered):
            if current.started_at is not None and previous.finished_at is not None:
                assert current.started_at >= previous.finished_at, (previous.seq, current.seq)

    # Never generated twice: at most one final "turn" line per turn across both workers'
    # logs. A turn's line follows its final write: one that w1 ended just before it was
    # stopped (its final write committed, its line not yet written) has none. Every other
    # turn has its line.
    finals = Counter(
        line["turn_id"]
        for worker in workers
        for line in worker.log_lines()
        if line.get("event") == "turn" and "turn_id" in line
    )
    assert set(finals) <= set(by_id) and max(finals.values()) == 1, finals
    unlogged = [by_id[turn_id] for turn_id in sorted(set(by_id) - set(finals))]
    assert all(
        t.status == TurnStatus.DONE
        and t.finished_at is not None
        and as_utc(t.finished_at) <= stopped_at
        for t in unlogged
    ), [(t.id, t.status, t.finished_at, stopped_at) for t in unlogged]
    taken_over = {
        line["turn_id"]: line["resumed"]
        for line in workers[1].log_lines()
        if line.get("event") == "turn" and line.get("resumed")
    }
    assert taken_over == dict.fromkeys(interrupted, 1), (taken_over, interrupted)


async def test_a_second_serve_on_the_same_sqlite_file_refuses_to_start(
    tmp_path: Path, vllm_servers: list[VLLMServer], demo_model_dir: Path, stop_workers: list[Worker]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'bot.db'}"
    await migrate(url)
    first = start_worker(
        "first", worker_env(url, "first", free_port(), vllm_servers, demo_model_dir), tmp_path
    )
    stop_workers.append(first)
    await wait_healthy(first)
    second = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "bot.cli", "serve"],
        env=worker_env(url, "second", free_port(), vllm_servers, demo_model_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode != 0
    assert "SQLite is single-process" in second.stderr
    assert first.process.poll() is None, "the first one keeps serving"
