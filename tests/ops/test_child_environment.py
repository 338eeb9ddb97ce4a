"""``botctl serve`` starts vLLM's engine processes without the service's secrets.

The service runs as a real process, given its secrets in the environment as an
EnvironmentFile would (``BOT_DATABASE__URL``, ``BOT_TENANCY__CACHE_SALT_SECRET``,
``BOT_ENGINE__API_KEY``); once it answers ``/readyz``, the environment of every
process it started (``/proc/PID/environ``) is read: none holds them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import psutil

from tests.conftest import migrate

MARKER = "SWORDFISH-42"
SECRET_VARIABLES = ("BOT_DATABASE__URL", "BOT_TENANCY__CACHE_SALT_SECRET", "BOT_ENGINE__API_KEY")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def environment_of(pid: int) -> str:
    """The environment a process was started with (Linux: ``/proc/PID/environ``)."""
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


async def wait_ready(url: str, process: asyncio.subprocess.Process) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):  # the engine takes a while on a busy machine
            assert process.returncode is None, "botctl serve exited before it was ready"
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise AssertionError("botctl serve was never ready")


async def test_engine_processes_inherit_no_secret(demo_model_dir: Path, tmp_path: Path) -> None:
    database = tmp_path / MARKER
    database.mkdir()
    url = f"sqlite+aiosqlite:///{database / 'bot.db'}"
    await migrate(url)
    port = free_port()
    environment = {
        **os.environ,
        "BOT_CONFIG": "",
        "BOT_DATABASE__URL": url,
        "BOT_TENANCY__CACHE_SALT_SECRET": f"salt-{MARKER}",
        "BOT_ENGINE__API_KEY": f"key-{MARKER}",
        "BOT_ENGINE__MODEL": str(demo_model_dir),
        "BOT_ENGINE__DTYPE": "float32",
        "BOT_ENGINE__MAX_MODEL_LEN": "1024",
        "BOT_ENGINE__BLOCK_SIZE": "32",
        "BOT_ENGINE__ENFORCE_EAGER": "true",
        "BOT_ENGINE__CPU_KVCACHE_SPACE_GIB": "1",
        "BOT_SERVER__PORT": str(port),
        "BOT_LOGGING__FORMAT": "json",
    }
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "botctl"),
        "serve",
        env=environment,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_ready(f"http://127.0.0.1:{port}/readyz", process)
        children = psutil.Process(process.pid).children(recursive=True)
        assert children, "vLLM runs its engine in a process of its own"
        for child in children:
            environ = environment_of(child.pid)
            names = {entry.partition("=")[0] for entry in environ.split("\0")}
            assert not names & set(SECRET_VARIABLES), (
                child.cmdline(),
                names & set(SECRET_VARIABLES),
            )
            assert MARKER not in environ, child.cmdline()
            assert "BOT_ENGINE__MODEL" in names  # what is not secret is left as it was
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(120):
            await process.wait()
