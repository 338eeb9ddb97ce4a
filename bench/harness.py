"""What every benchmark here needs: a percentile, the app on a loopback port, an API key,
and a client in a process of its own.

Benchmarks import it as a sibling module (``from harness import ...``): a script's own
folder is first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Self

import asyncpg
import psutil
from aiohttp import web
from sqlalchemy.engine import make_url

from bot.apikeys import create_key
from bot.demo_model import build_demo_model
from bot.engine.process_priority import ENGINE_CORE_TITLE, WORKER_TITLE, descendants, titled
from bot.storage.db import create_engine, create_sessionmaker
from bot.storage.migrate import upgrade


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` (a prepared folder) or the demo model, built in ``--model-dir``."""
    parser.add_argument(
        "--model-dir", default="data/demo-model", help="where the demo model is built (once)"
    )
    parser.add_argument(
        "--model",
        help="a prepared model folder to serve instead of the demo model, e.g. data/smollm2 "
        "(what `make run` serves, `make real-model`; dtype auto, as there)",
    )


def add_database_servers(parser: argparse.ArgumentParser) -> None:
    """``--database``, repeatable: PostgreSQL servers to run on after SQLite, a new
    database made on each (``scratch_database``)."""
    parser.add_argument(
        "--database",
        action="append",
        default=[],
        help="also a PostgreSQL server's URL, where a new database is made (repeatable)",
    )


def served_model(args: argparse.Namespace) -> tuple[Path, str]:
    """The model folder ``add_model_arguments`` chose, and its engine dtype."""
    if args.model:
        return Path(args.model), "auto"
    # float32: the demo model's figures across sessions were taken so.
    return build_demo_model(Path(args.model_dir)), "float32"


def engine_section(model: Path, dtype: str) -> dict[str, Any]:
    """The ``[engine]`` settings the benchmarks serve ``served_model``'s model with, in
    process (a vLLM server of their own replaces the keys ``engine_section()`` names)."""
    return {"model": str(model), "dtype": dtype, "max_model_len": 4096, "block_size": 32}


def model_name(args: argparse.Namespace) -> str:
    """The model ``served_model`` serves, for a benchmark's header."""
    return str(args.model or "demo model")


def engine_pids() -> list[int]:
    """vLLM's own processes started by this one: its engine core and its workers."""
    children = descendants()
    return titled(children, ENGINE_CORE_TITLE) + titled(children, WORKER_TITLE)


def engine_processes() -> str:
    """Where vLLM's own processes run and at which nice value, read off the processes."""
    found = [
        f"{process.name()} on CPUs {','.join(map(str, sorted(process.cpu_affinity())))}"
        f" at nice {process.nice()}"
        for process in map(psutil.Process, engine_pids())
    ]
    return "; ".join(sorted(found)) or "none found"


def engine_steps() -> tuple[int, int]:
    """Steps vLLM's engine has run in this process so far, and the tokens they computed.

    Read off vLLM's own ``vllm:iteration_tokens_total`` histogram (one observation a
    step: prompt and generated tokens scheduled in it), in this process's Prometheus
    registry, where the in-process engine's stat logger records it.
    """
    from prometheus_client import REGISTRY

    steps = tokens = 0.0
    for metric in REGISTRY.collect():
        if metric.name != "vllm:iteration_tokens_total":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                steps += sample.value
            elif sample.name.endswith("_sum"):
                tokens += sample.value
    return int(steps), int(tokens)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on a free 127.0.0.1 port; the runner (to clean up) and the base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


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

    ``server`` is a PostgreSQL URL (any driver named in it; the service's is asyncpg);
    the run gets a database of its own there, dropped
    afterwards, so that no earlier run's rows (queued turns of a run cut short) are
    in its way and it leaves none behind.
    """
    if server is None:
        url = f"sqlite+aiosqlite:///{workdir / 'bench.db'}"
        await asyncio.to_thread(upgrade, url)
        yield url
        return
    parsed = make_url(server)
    admin_dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        url = parsed.set(drivername="postgresql+asyncpg", database=name).render_as_string(
            hide_password=False
        )
        await asyncio.to_thread(upgrade, url)
        yield url
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


LOOPS = ("asyncio", "uvloop")
"""``--loop``: the event loop a benchmark runs on (uvloop to compare, not a dependency)."""


def run_on(loop: str, main: Coroutine[Any, Any, None]) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


class LoopLag:
    """How late the service's event loop runs a callback, sampled every ``every_s``.

    A handler waits at least this long before it starts: when the acks are slow and
    this is not, the time goes elsewhere (a lock, the database); when it is, the loop
    has more work than it can do.
    """

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
    """How long given threads ran and how long they were runnable but waited for a CPU.

    Read off Linux's ``/proc/PID/task/TID/schedstat`` (time on a CPU, time waiting on
    a run queue, in ns) at ``start`` and ``stop``. A loop that is late (``LoopLag``)
    while its thread waited on the run queue was not given a CPU: another process or
    thread had it. A late loop whose thread did not wait had more work than time.
    """

    def __init__(self, threads: dict[str, list[tuple[int, int]]]) -> None:
        self._threads = threads  # name -> its threads' (pid, tid), summed in one line
        self._started: dict[tuple[int, int], tuple[int, int]] = {}
        self._wall_started = 0.0

    def _read(self) -> dict[tuple[int, int], tuple[int, int]]:
        read: dict[tuple[int, int], tuple[int, int]] = {}
        for threads in self._threads.values():
            for pid, tid in threads:
                with contextlib.suppress(OSError):
                    fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
                    read[pid, tid] = (int(fields[0]), int(fields[1]))
        return read

    def start(self) -> None:
        self._started = self._read()
        self._wall_started = time.perf_counter()

    def stop(self) -> list[str]:
        """One line a name: ms on a CPU, ms waiting for one, the wait's share of the wall
        (summed over its threads; one that ended meanwhile counts for nothing)."""
        wall_ms = (time.perf_counter() - self._wall_started) * 1000
        now = self._read()
        lines = []
        for name, threads in self._threads.items():
            both = [thread for thread in threads if thread in now and thread in self._started]
            if not both:
                continue
            ran_ms = sum(now[t][0] - self._started[t][0] for t in both) / 1e6
            waited_ms = sum(now[t][1] - self._started[t][1] for t in both) / 1e6
            lines.append(
                f"{name} on a CPU {ran_ms:.0f} ms, runnable but waiting for one"
                f" {waited_ms:.0f} ms ({100 * waited_ms / max(wall_ms, 1e-9):.1f} % of"
                f" {wall_ms / 1000:.1f} s)"
            )
        return lines


def is_postgres(process: psutil.Process) -> bool:
    """A PostgreSQL server process: a connection's backend or a background one."""
    return process.name() == "postgres"


def postgres_backends_of(pids: Iterable[int]) -> dict[int, list[int]]:
    """The PostgreSQL backends serving each of ``pids``' TCP connections (their pools'):
    a backend whose connection's two ends are one of the process's, the other way round.
    One read of the host's connections for all of them; other users' sockets are named
    only for root: without it, none are found."""
    backends: dict[int, list[int]] = {pid: [] for pid in pids}
    with contextlib.suppress(psutil.Error):
        connections = [c for c in psutil.net_connections("tcp") if c.raddr and c.pid]
        client_of = {(c.laddr, c.raddr): c.pid for c in connections if c.pid in backends}
        postgres = set()
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if is_postgres(process):
                    postgres.add(process.pid)
        for c in connections:
            client = client_of.get((c.raddr, c.laddr))
            if c.pid in postgres and client is not None:
                backends[client].append(c.pid)
    return backends


def postgres_cpu_ms() -> float:
    """CPU time of every PostgreSQL server process on this host so far (ms, user +
    system): read before and after a run, what the database spent on it, its
    connections' backends and its own background processes alike (a backend that
    exits meanwhile takes its part with it: the service's pools keep theirs)."""
    total = 0.0
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if is_postgres(process):
                times = process.cpu_times()
                total += times.user + times.system
    return total * 1000


class CpuByProcess:
    """CPU time each kind of process on this host spent between ``start`` and ``stop``.

    On two cores the acks compete with the engine, the database and the load client
    for the CPU: which of them took it while the messages arrived says where the
    acks' waits for a core come from. Kinds: this process (the service), vLLM's
    engine processes, the named processes (``named``: pid -> name), PostgreSQL's
    server processes, and all others. A process that exits in between takes its
    part with it.
    """

    def __init__(self, named: dict[int, str]) -> None:
        self._named = named
        self._before: dict[int, tuple[str, float]] = {}

    def _kind(self, process: psutil.Process, engine: set[int]) -> str:
        if process.pid == os.getpid():
            return "service"
        if process.pid in engine:
            return "engine"
        if process.pid in self._named:
            return self._named[process.pid]
        return "PostgreSQL" if is_postgres(process) else "other"

    def _read(self) -> dict[int, tuple[str, float]]:
        engine = set(engine_pids())
        found: dict[int, tuple[str, float]] = {}
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                found[process.pid] = (self._kind(process, engine), times.user + times.system)
        return found

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> dict[str, float]:
        """ms of CPU a kind, most first."""
        spent: dict[str, float] = {}
        for pid, (kind, seconds) in self._read().items():
            earlier = self._before.get(pid, (kind, 0.0))[1]
            spent[kind] = spent.get(kind, 0.0) + (seconds - earlier) * 1000
        return dict(sorted(spent.items(), key=lambda item: -item[1]))


LINE_LIMIT = 2**26
"""One answer is one line: 4000 arrivals of bench/load.py take about 120 kB."""


class JsonLinesProcess:
    """A benchmark's client run as a process of its own: ``python SCRIPT ARGS...``.

    A client outside the service is another process: run on the service's own event
    loop, its building, parsing and timing of requests would compete with the server
    for that loop and be counted as the service's time. Protocol: one JSON line on its
    stdin per request, one JSON line back on its stdout (the other side is
    ``answer_json_lines``); end of stdin ends the process. Secrets go in ``env``, not on
    the command line.
    """

    def __init__(self, script: str, args: list[str], env: dict[str, str]) -> None:
        self._command = [sys.executable, str(Path(script).resolve()), *args]
        self._env = {**os.environ, **env}
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def ask(self, request: Any) -> Any:
        """Send one request, wait for its answer."""
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(request).encode() + b"\n")
        await process.stdin.drain()
        line = await process.stdout.readline()
        if not line:
            name = Path(self._command[1]).name
            raise RuntimeError(f"{name} exited ({await process.wait()})")
        return json.loads(line)

    async def __aenter__(self) -> Self:
        self._process = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=self._env,
            limit=LINE_LIMIT,
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
        result = await answer(json.loads(line))
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
