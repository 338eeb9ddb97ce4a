"""Benchmark: how fast the service acknowledges messages while the engine is busy.

Open-loop (Poisson) arrivals at each given rate, spread over many conversations
and, in turn, over the ways in (``--channels``): POST /v1/messages with an API
key, Telegram's webhook with its secret header and Slack's Events API signed
with slack_sdk's own signer, while the turns they create generate on the real
engine (demo model). A client that waits for the ack before sending the next
message would hide a slow ack behind its own pacing: here a message leaves at its
scheduled time whatever the earlier ones are doing.

Telegram's and Slack's side is played by the strict fakes of the test suite
(bot/testing/), served from a process of their own (bench/platform_fakes.py), as
the real platforms answer from elsewhere; ``--fakes-in-process`` serves them from
the service's loop as before, to compare.

The arrivals are sent from a separate process with its own event loop
(bench/load_client.py); this process only serves. A client outside the service
is another process: sent from the service's own loop, building, signing and
timing each request and reading each response would compete with the server
for that loop and show in the ack, which is not what an outside client sees.
``--client-in-process`` sends them from the service's loop as before, to compare.

Prints, per rate and channel: messages sent, ack p50/p99/max, refused (not
acknowledged) and lost (acknowledged but without a final turn once the engine
has drained; must be 0; "?" when turns are still open after ``--drain-s``, on a
machine whose engine is slower than the rate); the same for the conversations' first messages (which
create them, all at the start) and for the later ones; the service's event-loop
lag while they arrived and, for the loop's thread (and the ingress, client and
fakes processes' main threads), the time on a CPU and the time runnable but
waiting for one (Linux's schedstat): a late loop whose thread waited was not
given the CPU; the CPU time every kind of process on the host took while they
arrived (the service, the engine, PostgreSQL, the client and fakes, the rest): what
the acks competed with for the two cores; on PostgreSQL, the database's processes'
CPU time from the first arrival until the turns have drained (what the messages
cost the database); then the first rate whose ack p99 passes 25 ms.

``--engine-server`` moves the engine out of the service's process: a real vLLM
OpenAI server (bot/testing/vllm_servers.py) on its own core, reached as
``[engine] kind = "openai"``, so detokenization and the engine's output handling
leave the loop that answers the acks.

``--ingress-process`` (PostgreSQL) acknowledges in a process of its own: a real
``botctl serve`` with ``workers.run_turns = false`` takes the arrivals, stores
them and answers, and this process, woken by each accept's ``pg_notify``, runs
the turns (docs/scaling.md).

Run:  .venv/bin/python bench/load.py --rates 25,50,100 --seconds 4
      .venv/bin/python bench/load.py --rates 25,50,100 --seconds 4 --engine-server
      .venv/bin/python bench/load.py --rates 50,100 --client-in-process
      .venv/bin/python bench/load.py --database postgresql+asyncpg://127.0.0.1/test
      .venv/bin/python bench/load.py --database postgresql+asyncpg://127.0.0.1/test \
          --ingress-process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
from harness import (
    LOOPS,
    CpuByProcess,
    CpuWaits,
    LoopLag,
    add_model_arguments,
    bench_key,
    engine_processes,
    engine_section,
    is_postgres,
    model_name,
    percentile,
    postgres_backends_of,
    postgres_cpu_ms,
    run_on,
    scratch_database,
    serve_on_loopback,
    served_model,
)
from load_client import (
    SLACK_SIGNING_SECRET,
    TELEGRAM_BOT,
    TELEGRAM_SECRET,
    InProcessClient,
    LoadClient,
    Plan,
    SubprocessClient,
)
from platform_fakes import (
    SLACK_TOKEN,
    TELEGRAM_TOKEN,
    TELEGRAM_USERNAME,
    FakesProcess,
    FakeUrls,
    InProcessFakes,
    PlatformFakes,
)
from sqlalchemy import func, select

from bot.app import create_app
from bot.config import load_settings
from bot.engine.base import InferenceEngine
from bot.engine.openai_remote import OpenAIRemoteEngine
from bot.engine.vllm_local import LocalVLLMEngine
from bot.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker, is_sqlite
from bot.storage.models import Turn, TurnStatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.testing.vllm_servers import VLLMServer, free_port, launch, wait_ready

ACK_P99_GOAL_MS = 25.0
CHANNELS = ("api", "telegram", "slack")
SLACK_APP = "A0001APP"


async def final_turns(db_url: str, since: dt.datetime) -> dict[str, int]:
    """Turns of this run (received ``since``) that reached a final status, by channel.

    Only this run's: a PostgreSQL database may hold earlier runs' turns.
    """
    engine = create_engine(db_url)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = await session.execute(
                select(Turn.channel, func.count())
                .where(Turn.status.in_(TurnStatus.FINAL), Turn.created_at >= since)
                .group_by(Turn.channel)
            )
            finals: dict[str, int] = {}
            for channel, count in rows.all():
                # Telegram's and Slack's channels are named after the bot: telegram:<name>.
                kind = str(channel).split(":", 1)[0]
                finals[kind] = finals.get(kind, 0) + int(count)
            return finals
    finally:
        await engine.dispose()


async def drain(db_url: str, since: dt.datetime, timeout_s: float) -> int:
    """Until every turn of this run is final: run here, or (``--ingress-process``) accepted
    elsewhere and perhaps not announced to this process yet. Returns how many were still
    open after ``timeout_s`` (0: drained): on a machine whose engine is slower than the
    arrivals the acks are measured all the same, and only "lost" cannot be told.

    It reads the rows, and never waits on the turns' tasks: a wait cut short by the
    timeout would cancel them (``asyncio.gather``)."""
    engine = create_engine(db_url)
    sessions = create_sessionmaker(engine)

    async def still_open() -> int:
        async with sessions() as session:
            count = await session.scalar(
                select(func.count())
                .select_from(Turn)
                .where(Turn.status.not_in(TurnStatus.FINAL), Turn.created_at >= since)
            )
        return int(count or 0)

    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while await still_open():  # noqa: ASYNC110 (rows of other processes: no event)
                    await asyncio.sleep(0.2)
        return await still_open()
    finally:
        await engine.dispose()


AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


@functools.cache
def autogroups() -> bool:
    """Whether the kernel groups tasks by session for the scheduler (autogroup)."""
    return AUTOGROUP.exists() and AUTOGROUP.read_text().strip() == "1"


def set_nice(pid: int, nice: int, group_nice: int | None) -> None:
    """``pid``'s nice value and, where tasks are grouped by session, its group's."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    if group_nice is not None and autogroups():
        Path(f"/proc/{pid}/autogroup").write_text(str(group_nice))


def group_nice_of(pid: int) -> int | None:
    """The nice value of ``pid``'s session group ("/autogroup-5 nice 0"), if tasks are grouped."""
    if not autogroups():
        return None
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


def renice_postgres(nice: int) -> dict[int, tuple[int, int | None]]:
    """Every PostgreSQL server process on this host at ``nice``, and its scheduling group
    (each backend is a session of its own: where the kernel groups tasks by session, its
    group's weight is what counts against the benchmark's), as ``CPUWeight=`` on
    postgresql.service would put the database ahead of the engine. Needs root.

    Returns each changed process's values before, for ``restore_nice``; refuses (and
    puts back what it changed) unless it could change them all.
    """
    before: dict[int, tuple[int, int | None]] = {}
    try:
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.NoSuchProcess):
                if is_postgres(process):
                    old = (process.nice(), group_nice_of(process.pid))
                    set_nice(process.pid, nice, nice)
                    before[process.pid] = old
    except (psutil.AccessDenied, PermissionError) as exc:
        restore_nice(before)
        raise SystemExit(f"--postgres-nice: {exc} (needs root)") from exc
    if not before:
        raise SystemExit("--postgres-nice: no PostgreSQL server process on this host")
    return before


def restore_nice(before: dict[int, tuple[int, int | None]]) -> None:
    """Put back the values ``renice_postgres`` changed (of the processes still there)."""
    for pid, (nice, group_nice) in before.items():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            set_nice(pid, nice, group_nice)


def start_ingress_process(
    sections: dict[str, Any], log_path: Path, nice: int = 0, *, own_group: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """A real ``botctl serve`` that only acknowledges (``workers.run_turns = false``).

    ``nice``: its scheduling priority (negative: ahead of the turns' and the engine's
    processes when the CPU is short, as systemd's ``Nice=`` would set it; needs root).

    ``own_group``: in a session of its own, as systemd runs each unit in a cgroup of
    its own. Where the kernel groups tasks by session for the scheduler (autogroup,
    /proc/sys/kernel/sched_autogroup_enabled), a nice value orders tasks only within
    their group, and the groups share the CPU by their own weights: PostgreSQL's
    backends, each in a session of its own, each weigh as much as the benchmark's
    whole session (engine, turns, client). ``nice`` then goes to the ingress's group
    too (/proc/PID/autogroup), as ``CPUWeight=`` sets a unit's cgroup weight.
    """
    port = free_port()
    env = {
        **os.environ,
        # Each section as JSON, as pydantic-settings reads complex values from the environment.
        **{f"BOT_{name.upper()}": json.dumps(value) for name, value in sections.items()},
        "BOT_SERVER": json.dumps({"host": "127.0.0.1", "port": port}),
        "BOT_WORKERS": json.dumps({"run_turns": False}),
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=own_group,
        )
    try:
        if nice:
            set_nice(process.pid, nice, nice if own_group else None)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(
                    f"the ingress process exited ({process.returncode}): see {log_path}"
                )
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return process, base
            except OSError:
                time.sleep(0.3)
        raise SystemExit(f"the ingress process was not ready in 120 s: see {log_path}")
    except BaseException:
        # In a session of its own, no Ctrl-C of the benchmark's reaches it.
        process.kill()
        raise


def platform_settings(urls: FakeUrls) -> dict[str, Any]:
    # The replies are paced as in production (the settings' defaults, the platforms'
    # limits): a reply edited every 50 ms would make ~20 times the platform calls a
    # real chat makes, all of them on the service's loop beside the acks.
    bot = {
        "name": TELEGRAM_BOT,
        "token": TELEGRAM_TOKEN,
        "secret_token": TELEGRAM_SECRET,
        "api_base_url": urls.telegram,
        "username": TELEGRAM_USERNAME,
    }
    app = {
        "name": "main",
        "signing_secret": SLACK_SIGNING_SECRET,
        "bot_token": SLACK_TOKEN,
        "api_base_url": urls.slack,
        "app_id": SLACK_APP,
    }
    return {"telegram": [bot], "slack": [app]}


def row(rate: float, channel: str, results: list[tuple[float, int]], lost: int | str) -> float:
    """Print one line; returns the ack p99 (ms) of the acknowledged messages."""
    acks = [ms for ms, status in results if status in (200, 202)]
    refused = len(results) - len(acks)
    p99 = percentile(acks, 99)
    print(
        f"{rate:>6g}  {channel:<8}  {len(results):>4}  {percentile(acks, 50):>10.1f}"
        f"  {p99:>10.1f}  {max(acks, default=float('nan')):>10.1f}  {refused:>7}  {lost:>4}"
    )
    return p99


async def main(args: argparse.Namespace) -> None:
    configure_logging(os.environ.get("BENCH_LOG_LEVEL", "WARNING"), "json")
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    async with scratch_database(workdir, args.database) as db_url:
        await run(args, workdir, db_url)


async def run(args: argparse.Namespace, workdir: Path, db_url: str) -> None:
    channels = [c for c in args.channels.split(",") if c]
    unknown = set(channels) - set(CHANNELS)
    if unknown or not channels:
        raise SystemExit(f"--channels: pick from {', '.join(CHANNELS)}")
    model, dtype = served_model(args)
    fakes: PlatformFakes = (
        InProcessFakes() if args.fakes_in_process else FakesProcess(args.client_loop)
    )
    await fakes.__aenter__()
    engine_settings = engine_section(model, dtype)
    server: VLLMServer | None = None
    if args.engine_server:
        # The server on the second core; the service (and its loop) keep the first.
        server = launch(model, workdir, core=1 % (os.cpu_count() or 1))
        await asyncio.to_thread(wait_ready, server, time.monotonic())
        engine_settings.update(server.engine_section())
    sections: dict[str, Any] = {
        "database": {"url": db_url},
        "engine": engine_settings,
        "generation": {"max_tokens": args.max_tokens, "temperature": 0.0, "top_p": 1.0},
        "logging": {"level": "WARNING", "format": "json"},
        "limits": {"messages_per_minute": 0, "tokens_per_day": 0},
        **platform_settings(fakes.urls),
    }
    settings = load_settings(None, **sections)
    engine: InferenceEngine = (
        OpenAIRemoteEngine(settings.engine) if server else LocalVLLMEngine(settings.engine)
    )
    await engine.start()
    app = await create_app(settings, engine=engine)
    runner, base = await serve_on_loopback(app)
    ingress: subprocess.Popen[bytes] | None = None
    reniced: dict[int, tuple[int, int | None]] = {}
    if args.ingress_process:
        if is_sqlite(db_url):
            raise SystemExit("--ingress-process needs --database postgresql+asyncpg://...")
        ingress, base = await asyncio.to_thread(
            functools.partial(
                start_ingress_process,
                sections,
                workdir / "ingress.log",
                args.ingress_nice,
                own_group=args.ingress_group,
            )
        )
    try:
        key = await bench_key(db_url, f"bench-{uuid.uuid4().hex[:6]}")
    except BaseException:
        if ingress is not None:  # in a session of its own: nothing else stops it
            ingress.kill()
        raise

    rates = [float(r) for r in args.rates.split(",")]
    since = dt.datetime.now(dt.UTC)
    run = uuid.uuid4().hex[:6]
    print(f"# ack latency under open-loop load, {args.seconds:g} s a rate, {args.conversations}")
    print(f"# conversations a channel, max_tokens={args.max_tokens}, ", end="")
    print(f"{model_name(args)}, CPU, database:")
    print(f"# {'SQLite' if db_url.startswith('sqlite') else 'PostgreSQL'}; load average", end="")
    print(f" {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start")
    where = "the service's own event loop" if args.client_in_process else "a separate process"
    print(f"# arrivals sent from {where}; loop: service {args.loop}", end="")
    print("" if args.client_in_process else f", client {args.client_loop}")
    if server:
        print("# engine: a vLLM server in its own process")
    else:
        print(f"# engine: in the service process; {engine_processes()}")
    if ingress is not None:
        print(
            "# acks from an ingress-only `botctl serve` (nice"
            f" {args.ingress_nice}"
            f"{', a scheduling group of its own' if args.ingress_group else ''});"
            " turns run in this process"
        )
    if args.postgres_nice:
        print(f"# PostgreSQL's processes and their groups at nice {args.postgres_nice}")
    print("rate/s  channel   sent  ack_p50_ms  ack_p99_ms  ack_max_ms  refused  lost")
    first_over: float | None = None
    accepted: dict[str, int] = dict.fromkeys(channels, 0)
    client: LoadClient
    lag = LoopLag()
    if args.client_in_process:
        client = InProcessClient(base, key, channels)
    else:
        client = SubprocessClient(base, key, channels, args.client_loop)
    try:
        async with client:
            # Not measured: the engine's first requests, each channel's first message.
            warmup = await client.send(Plan(5.0, args.warmup_s, 4, f"{run}w"))
            if still_open := await drain(db_url, since, args.drain_s):
                print(f"# the warm-up's turns not drained in {args.drain_s:g} s: {still_open} open")
            for channel, _, status in warmup:
                accepted[channel] += status in (200, 202)
            # The benchmark's other processes, by name: their main threads' waits for a
            # CPU and their CPU time are told apart from the rest.
            processes: dict[int, str] = {}
            if ingress is not None:
                processes[ingress.pid] = "ingress process"
            if isinstance(client, SubprocessClient) and client.pid is not None:
                processes[client.pid] = "client process"
            if fakes.pid is not None:
                processes[fakes.pid] = "fakes process"
            threads = {"service loop thread": [(os.getpid(), threading.get_native_id())]}
            threads |= {f"{name}'s main thread": [(pid, pid)] for pid, name in processes.items()}
            # The statements run there: a backend waiting for a CPU holds an ack or a turn.
            named = {os.getpid(): "service", **processes}
            found = {} if is_sqlite(db_url) else postgres_backends_of(named)
            for pid, backends in found.items():
                if backends:
                    threads[f"{named[pid]}'s {len(backends)} PostgreSQL backends, summed,"] = [
                        (backend, backend) for backend in backends
                    ]
            if args.postgres_nice:
                reniced = renice_postgres(args.postgres_nice)
            cpu_waits = CpuWaits(threads)
            cpu_by_process = CpuByProcess(processes)
            for rate in rates:
                batch = f"{run}{rate:g}".replace(".", "")
                lag.start()
                cpu_waits.start()
                cpu_by_process.start()
                database_cpu_ms = postgres_cpu_ms()
                results = await client.send(Plan(rate, args.seconds, args.conversations, batch))
                lags = lag.stop()
                waits = cpu_waits.stop()
                spent = cpu_by_process.stop()
                still_open = await drain(db_url, since, args.drain_s)
                database_cpu_ms = postgres_cpu_ms() - database_cpu_ms
                finals = await final_turns(db_url, since)
                for channel, _, status in results:
                    accepted[channel] += status in (200, 202)
                lost: dict[str, int | str] = {
                    c: "?" if still_open else accepted[c] - finals.get(c, 0) for c in channels
                }
                all_lost = "?" if still_open else sum(int(n) for n in lost.values())
                p99 = row(rate, "all", [(ms, st) for _, ms, st in results], all_lost)
                # Message i goes to channel i % C and conversation i % K: the first lcm(C, K)
                # are each a conversation's first, which creates it.
                firsts = math.lcm(len(channels), args.conversations)
                row(rate, "firsts", [(ms, st) for _, ms, st in results[:firsts]], "")
                row(rate, "later", [(ms, st) for _, ms, st in results[firsts:]], "")
                if len(channels) > 1:
                    for channel in channels:
                        mine = [(ms, st) for c, ms, st in results if c == channel]
                        row(rate, channel, mine, lost[channel])
                if still_open:
                    print(
                        f"{'':6}  {still_open} turns still open after --drain-s"
                        f" {args.drain_s:g}: lost not known (the engine is slower than the"
                        " arrivals so far)"
                    )
                print(
                    f"{'':6}  loop lag while they arrived: p50 {percentile(lags, 50):.1f}"
                    f" p99 {percentile(lags, 99):.1f} max {max(lags, default=0):.1f} ms"
                )
                for line in waits:
                    print(f"{'':6}  {line}")
                shares = ", ".join(f"{kind} {ms:.0f}" for kind, ms in spent.items())
                print(f"{'':6}  CPU ms while they arrived, by process: {shares}")
                if not is_sqlite(db_url):
                    print(
                        f"{'':6}  PostgreSQL's processes on a CPU {database_cpu_ms:.0f} ms for"
                        f" these messages' acks and turns"
                        f" ({database_cpu_ms / max(len(results), 1):.2f} ms a message)"
                    )
                if first_over is None and p99 > ACK_P99_GOAL_MS:
                    first_over = rate
    finally:
        restore_nice(reniced)  # the server is the host's: as it was before
        if ingress is not None:
            ingress.terminate()
            await asyncio.to_thread(ingress.wait, 30)
        await runner.cleanup()
        await engine.shutdown()
        if server:
            server.stop()
        await fakes.__aexit__(None, None, None)
    if first_over is None:
        print(f"ack p99 stayed within {ACK_P99_GOAL_MS:g} ms at every rate tried")
    else:
        print(f"ack p99 first passed {ACK_P99_GOAL_MS:g} ms at {first_over:g} messages/s")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="25,50,100", help="messages per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="arrivals per rate")
    parser.add_argument("--conversations", type=int, default=40, help="per channel")
    parser.add_argument(
        "--channels", default=",".join(CHANNELS), help="ways in, in turn: api,telegram,slack"
    )
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--drain-s", type=float, default=300.0)
    parser.add_argument(
        "--warmup-s", type=float, default=2.0, help="unmeasured arrivals at 5/s first"
    )
    parser.add_argument(
        "--database",
        default=None,
        help="a PostgreSQL server's URL: the run gets a new database there (default: SQLite)",
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--loop", choices=LOOPS, default="asyncio", help="the service's and the client's loop"
    )
    parser.add_argument(
        "--client-loop",
        choices=LOOPS,
        default=None,
        help="the client's loop if not --loop's (to compare the service's loops alone)",
    )
    parser.add_argument(
        "--client-in-process",
        action="store_true",
        help="send the arrivals from the service's own event loop (not a separate process)",
    )
    parser.add_argument(
        "--fakes-in-process",
        action="store_true",
        help="serve Telegram's and Slack's fakes from the service's loop (not a process)",
    )
    parser.add_argument(
        "--engine-server",
        action="store_true",
        help="the engine in a vLLM OpenAI server process of its own, not in the service",
    )
    parser.add_argument(
        "--ingress-process",
        action="store_true",
        help="acknowledge in an ingress-only `botctl serve` of its own (PostgreSQL)",
    )
    parser.add_argument(
        "--ingress-nice",
        type=int,
        default=0,
        help="the ingress process's nice value (e.g. -5: ahead of the turns when CPU is short)",
    )
    parser.add_argument(
        "--postgres-nice",
        type=int,
        default=0,
        help="the PostgreSQL server's processes' nice value and their groups' (e.g. -10: the"
        " database ahead of the engine when the CPU is short), set once the pools are open",
    )
    parser.add_argument(
        "--ingress-group",
        action="store_true",
        help="the ingress process in a session (scheduling group) of its own, as systemd runs"
        " a unit; --ingress-nice then sets the group's nice too",
    )
    arguments = parser.parse_args()
    arguments.client_loop = arguments.client_loop or arguments.loop
    run_on(arguments.loop, main(arguments))
