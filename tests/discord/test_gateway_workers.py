"""Two real ``botctl serve`` workers on one PostgreSQL: one holds the bot's gateway.

Both are configured with the gateway on; the fake gateway must see exactly one
of them identify, and keep seeing one connection while both run. When the
holder is SIGKILLed, PostgreSQL drops its advisory lock with its connection
and the other worker connects within a poll. The workers take messages in and
leave the turns to the workers that run them (``workers.run_turns = false``):
the subject here is who holds the gateway, not the replies.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bot.testing.discord_api import FakeDiscordApi
from bot.testing.discord_gateway import FakeDiscordGateway
from bot.testing.vllm_servers import free_port
from tests.discord.conftest import bot_table
from tests.discord.test_gateway import dm
from tests.helpers import count_rows, wait_until

pytestmark = pytest.mark.postgres
LEASE_POLL_S = 0.5


def start_worker(
    name: str, pg_url: str, model: Path, api: FakeDiscordApi, log_dir: Path
) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    table = bot_table(api.base_url, gateway=True, gateway_lease_poll_s=LEASE_POLL_S)
    env = {
        **os.environ,
        "BOT_DATABASE__URL": pg_url,
        "BOT_SERVER__PORT": str(port),
        "BOT_SERVER__SHUTDOWN_GRACE_S": "1",
        "BOT_ENGINE__MODEL": str(model),
        "BOT_WORKERS__RUN_TURNS": "false",
        "BOT_WORKERS__ID": name,
        "BOT_LOGGING__FORMAT": "json",
        "BOT_DISCORD": json.dumps([table]),
    }
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, port, log_path


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


async def wait_healthy(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert process.poll() is None, tail(log)
            try:
                async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(tail(log))


def connected_in(log: Path) -> int:
    return log.read_text(errors="replace").count('"discord_gateway_connected"')


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_one_worker_holds_the_gateway_and_another_takes_over_when_it_dies(
    pg_url: str,
    demo_model_dir: Path,
    discord_api: FakeDiscordApi,
    discord_gateway: FakeDiscordGateway,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    workers = [
        start_worker(name, pg_url, demo_model_dir, discord_api, tmp_path) for name in ("a", "b")
    ]
    processes.extend(process for process, _, _ in workers)
    for process, port, log in workers:
        await wait_healthy(port, process, log)
    await asyncio.wait_for(discord_gateway.connected.wait(), 30)
    # Several of the other worker's polls: it never connects while the holder lives.
    await asyncio.sleep(10 * LEASE_POLL_S)
    assert len(discord_gateway.identifies) == 1, discord_gateway.identifies
    assert len(discord_gateway.connections) == 1
    holders = [index for index, (_, _, log) in enumerate(workers) if connected_in(log)]
    assert len(holders) == 1
    holder, other = workers[holders[0]], workers[1 - holders[0]]

    holder[0].send_signal(signal.SIGKILL)
    holder[0].wait(timeout=10)
    killed_at = time.monotonic()
    await wait_until(lambda: len(discord_gateway.identifies) == 2, 30)
    took_over_s = time.monotonic() - killed_at
    await wait_until(lambda: connected_in(other[2]) == 1, 10)
    print(f"gateway taken over {took_over_s:.2f} s after the holder was killed")
    assert took_over_s < 15, took_over_s

    # The new holder feeds the same accept path: the message is stored, once.
    await asyncio.wait_for(discord_gateway.connected.wait(), 30)
    await discord_gateway.dispatch("MESSAGE_CREATE", dm("1230000000000000031", "still here?"))
    for _ in range(100):
        stored = (await count_rows(pg_url))["inbound_events"]
        if stored:
            break
        await asyncio.sleep(0.2)
    assert stored == 1
