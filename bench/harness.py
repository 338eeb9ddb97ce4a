"""What the benchmarks share: the model and settings they serve, a scratch database, the app
on a loopback port, an API key, the prefix-cache share, a client process, CPU accounting.

Benchmarks import it as a sibling module (``from harness import ...``): a script's own
folder is first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Self

import asyncpg
import psutil
from aiohttp import web
from sqlalchemy.engine import make_url

from bot.apikeys import create_key
from bot.engine.process_priority import ENGINE_CORE_TITLE, WORKER_TITLE, descendants, titled
from bot.models.demo_model import build_demo_model
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.migrate import upgrade

REPO = Path(__file__).resolve().parents[1]
DEMO_MODEL_DIR = REPO / "data" / "demo-model"
"""Where the demo model is built once (ignored by git, as ``make model`` builds it)."""
BLOCK_SIZE = 32
"""The KV cache's block: only full blocks are cached, so only full blocks count as cacheable."""
NO_LIMITS = {"messages_per_minute": 0, "tokens_per_day": 0}
"""A benchmark is one key sending many messages: fair use would throttle it."""


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` (a prepared folder) or the demo model, built in ``--model-dir``."""
    parser.add_argument("--model-dir", default=str(DEMO_MODEL_DIR), help="the demo model's folder")
    parser.add_argument(
        "--model",
        help="a prepared model folder to serve instead of the demo model, e.g. data/smollm2 "
        "(what `make run` serves, `make real-model`; dtype auto, as there)",
    )


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


def engine_pids() -> list[int]:
    """vLLM's own processes started by this one: its engine core and its workers."""
    children = descendants()
    return titled(children, ENGINE_CORE_TITLE) + titled(children, WORKER_TITLE)


def engine_processes() -> str:
    """Where vLLM's own processes run and at which nice value (``engine.core_on_worker_cpus``,
    ``engine.process_nice``), read off the processes."""
    found = [
        f"{process.name()} on CPUs {','.join(map(str, sorted(process.cpu_affinity())))}"
        f" at nice {process.nice()}"
        for process in map(psutil.Process, engine_pids())
    ]
    return "; ".join(sorted(found)) or "none found"


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


class CpuWaits:
    """How long threads ran and how long they were runnable but waited for a CPU, read off
    Linux's ``/proc/PID/task/TID/schedstat``. A late loop whose thread waited was not given
    a CPU (another process had it); one whose thread did not wait had more work than time."""

    def __init__(self, threads: dict[str, list[tuple[int, int]]]) -> None:
        self._threads = threads  # name -> its threads' (pid, tid), summed in one line
        self._started: dict[tuple[int, int], tuple[int, int]] = {}
        self._wall_started = 0.0

    def _read(self) -> dict[tuple[int, int], tuple[int, int]]:
        read: dict[tuple[int, int], tuple[int, int]] = {}
        for pid, tid in itertools.chain.from_iterable(self._threads.values()):
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
                read[pid, tid] = (int(fields[0]), int(fields[1]))
        return read

    def start(self) -> None:
        self._started = self._read()
        self._wall_started = time.perf_counter()

    def stop(self) -> list[str]:
        """One line a name: ms on a CPU, ms waiting for one, the wait's share of the wall."""
        wall_ms = (time.perf_counter() - self._wall_started) * 1000
        now = self._read()
        lines = []
        for name, threads in self._threads.items():
            both = [thread for thread in threads if thread in now and thread in self._started]
            if both:
                ran_ms = sum(now[t][0] - self._started[t][0] for t in both) / 1e6
                waited_ms = sum(now[t][1] - self._started[t][1] for t in both) / 1e6
                lines.append(
                    f"{name} on a CPU {ran_ms:.0f} ms, runnable but waiting for one"
                    f" {waited_ms:.0f} ms ({100 * waited_ms / max(wall_ms, 1e-9):.1f} % of"
                    f" {wall_ms / 1000:.1f} s)"
                )
        return lines


class CpuByProcess:
    """CPU ms each kind of process on this host spent between ``start`` and ``stop``: this
    process (the service), vLLM's engine, the ``named`` ones (pid -> name), PostgreSQL's
    server processes and the rest. On two cores that is what the acks compete with."""

    def __init__(self, named: dict[int, str]) -> None:
        self._named = named
        self._before: dict[int, tuple[str, float]] = {}

    def _read(self) -> dict[int, tuple[str, float]]:
        engine = set(engine_pids())
        found: dict[int, tuple[str, float]] = {}
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                pid = process.pid
                kind = (
                    "service"
                    if pid == os.getpid()
                    else "engine"
                    if pid in engine
                    else self._named.get(pid)
                    or ("PostgreSQL" if process.name() == "postgres" else "other")
                )
                times = process.cpu_times()
                found[pid] = (kind, times.user + times.system)
        return found

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> dict[str, float]:
        spent: dict[str, float] = {}
        for pid, (kind, seconds) in self._read().items():
            spent[kind] = spent.get(kind, 0.0) + (seconds - self._before.get(pid, ("", 0.0))[1])
        return {kind: ms * 1000 for kind, ms in sorted(spent.items(), key=lambda kv: -kv[1])}


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

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

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
