"""Benchmark: how fast the service acknowledges messages while the engine is busy.

Open-loop (Poisson) arrivals at each rate, spread over many conversations and, in turn,
over the ways in (``--channels``): ``POST /v1/messages`` with an API key, Telegram's
webhook with its secret header and Slack's signed Events API, while the turns they
create generate on the real engine in the service's process. The arrivals come from a
client process of its own, and the turns' replies go to the strict platform fakes in
another (bench/load_client.py): this process only serves, as in production.

Prints, per rate: messages sent, ack p50/p99/max, refused (not acknowledged) and lost
(acknowledged, and no final turn once the engine has drained: must be 0; "?" while
turns are still open after ``--drain-s``), overall, for the conversations' first
messages (each creates its conversation, all in the first second) and the later ones,
and by channel; then the service loop's lag while they arrived, how long the loop's
thread and the other processes' main threads ran and waited for a CPU, and the CPU
every kind of process took meanwhile (what the acks competed with); last, the first
rate whose ack p99 passed the goal.

``--ingress-process`` (PostgreSQL) acknowledges in a process of its own: a real ``botctl
serve`` with ``workers.run_turns = false`` takes the arrivals, stores them and answers,
and this process, woken by each accept's ``pg_notify``, runs the turns (docs/scaling.md);
``--ingress-nice -10 --ingress-group`` run it as deploy/bot-ingress.service does (needs
root).

Run:  .venv/bin/python bench/load.py --rates 100 --seconds 8 --model data/smollm2
      .venv/bin/python bench/load.py --rates 100 --seconds 8 --model data/smollm2 \\
          --database postgresql+asyncpg://127.0.0.1/test [--ingress-process]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
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

from harness import (
    CpuByProcess,
    CpuWaits,
    LoopLag,
    add_model_arguments,
    bench_key,
    engine_processes,
    load_average,
    local_engine,
    model_name,
    percentile,
    scratch_database,
    serve_on_loopback,
    served_model,
    service_sections,
)
from load_client import client_process, fakes_process
from platform_requests import slack_app, telegram_bot
from sqlalchemy import func, select

from bot.app import create_app
from bot.config import load_settings
from bot.engine.vllm_local import LocalVLLMEngine
from bot.ops.log import configure_logging
from bot.storage.db import create_engine, create_sessionmaker, is_sqlite
from bot.storage.models import Turn, TurnStatus
from bot.testing.vllm_servers import free_port

ACK_P99_GOAL_MS = 25.0
CHANNELS = ("api", "telegram", "slack")


async def count_turns(db_url: str, since: dt.datetime, final: bool) -> dict[str, int]:
    """This run's turns (received ``since``: a PostgreSQL database may hold earlier runs'),
    final or still open, by channel kind (Telegram's and Slack's are ``telegram:<bot>``)."""
    engine = create_engine(db_url)
    status = Turn.status.in_(TurnStatus.FINAL) if final else Turn.status.not_in(TurnStatus.FINAL)
    try:
        async with create_sessionmaker(engine)() as session:
            rows = await session.execute(
                select(Turn.channel, func.count())
                .where(status, Turn.created_at >= since)
                .group_by(Turn.channel)
            )
            counts: dict[str, int] = {}
            for channel, count in rows.all():
                kind = str(channel).split(":", 1)[0]
                counts[kind] = counts.get(kind, 0) + int(count)
            return counts
    finally:
        await engine.dispose()


async def drain(db_url: str, since: dt.datetime, timeout_s: float) -> int:
    """Wait until every turn of this run is final (run here, or accepted by the ingress and
    not announced yet); how many are still open after ``timeout_s``. It reads the rows and
    never waits on the turns' tasks, which a timeout would cancel."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while await count_turns(db_url, since, final=False):  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    return sum((await count_turns(db_url, since, final=False)).values())


def set_nice(pid: int, nice: int, group: bool) -> None:
    """``pid``'s nice value and, with ``group`` where the kernel groups tasks by session
    (autogroup), its group's: a nice value orders tasks only within their group, and each
    PostgreSQL backend, a session of its own, weighs as much as the benchmark's whole
    session. That is what ``CPUWeight=`` on a systemd unit's cgroup sets."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if group and autogroup.exists() and autogroup.read_text().strip() == "1":
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def start_ingress_process(
    sections: dict[str, Any], log_path: Path, nice: int, own_group: bool
) -> tuple[subprocess.Popen[bytes], str]:
    """A real ``botctl serve`` that only acknowledges (``workers.run_turns = false``), at
    ``nice`` and (``own_group``) in a session of its own, as systemd runs a unit."""
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
            set_nice(process.pid, nice, own_group)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the ingress process exited ({process.returncode}): {log_path}")
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return process, base
            except OSError:
                time.sleep(0.3)
        raise SystemExit(f"the ingress process was not ready in 120 s: see {log_path}")
    except BaseException:
        process.kill()  # in a session of its own, no Ctrl-C of the benchmark reaches it
        raise


def row(rate: float, name: str, results: list[tuple[str, float, int]], lost: int | str) -> float:
    """Print one line; returns the ack p99 (ms) of the acknowledged messages."""
    acks = [ms for _, ms, status in results if status in (200, 202)]
    p99 = percentile(acks, 99)
    print(
        f"{rate:>6g}  {name:<8}  {len(results):>4}  {percentile(acks, 50):>10.1f}  {p99:>10.1f}"
        f"  {max(acks, default=float('nan')):>10.1f}  {len(results) - len(acks):>7}  {lost:>4}"
    )
    return p99


async def main(args: argparse.Namespace) -> None:
    configure_logging(os.environ.get("BENCH_LOG_LEVEL", "WARNING"), "json")
    channels = [c for c in args.channels.split(",") if c]
    if not channels or set(channels) - set(CHANNELS):
        raise SystemExit(f"--channels: pick from {', '.join(CHANNELS)}")
    workdir = Path(tempfile.mkdtemp(prefix="bench-load-"))
    model, dtype = served_model(args)
    async with scratch_database(workdir, args.database) as db_url, fakes_process() as fakes:
        if args.ingress_process and is_sqlite(db_url):
            raise SystemExit("--ingress-process needs --database postgresql+asyncpg://...")
        urls = await fakes.ask({})
        sections = service_sections(db_url, local_engine(model, dtype), args.max_tokens)
        # Replies paced as in production (the settings' defaults, the platforms' limits).
        sections |= {"telegram": [telegram_bot(urls["telegram"])]}
        sections |= {"slack": [slack_app(urls["slack"])]}
        settings = load_settings(None, **sections)
        engine = LocalVLLMEngine(settings.engine)
        await engine.start()
        runner, base = await serve_on_loopback(await create_app(settings, engine=engine))
        ingress: subprocess.Popen[bytes] | None = None
        try:
            if args.ingress_process:
                ingress, base = await asyncio.to_thread(
                    start_ingress_process,
                    sections,
                    workdir / "ingress.log",
                    args.ingress_nice,
                    args.ingress_group,
                )
            key = await bench_key(db_url, f"bench-{uuid.uuid4().hex[:6]}")
            async with client_process(base, key, channels) as client:
                named = {client.pid: "client process", fakes.pid: "fakes process"}
                if ingress is not None:
                    named[ingress.pid] = "ingress process"
                await measure(args, client, {k: v for k, v in named.items() if k}, db_url)
        finally:
            if ingress is not None:
                ingress.terminate()
                await asyncio.to_thread(ingress.wait, 30)
            await runner.cleanup()
            await engine.shutdown()


async def measure(
    args: argparse.Namespace, client: Any, named: dict[int, str], db_url: str
) -> None:
    channels = [c for c in args.channels.split(",") if c]
    database = "SQLite" if is_sqlite(db_url) else "PostgreSQL"
    print(f"# ack latency under open-loop load, {args.seconds:g} s a rate, {args.conversations}")
    print(f"# conversations a channel, max_tokens={args.max_tokens}, {model_name(args)}, CPU,")
    print(f"# {database}; load average {load_average()} at the start")
    print(f"# engine in the service's process: {engine_processes()}")
    if "ingress process" in named.values():
        group = ", a scheduling group of its own" if args.ingress_group else ""
        print(f"# acks from an ingress-only `botctl serve` (nice {args.ingress_nice}{group})")
    run, since = uuid.uuid4().hex[:6], dt.datetime.now(dt.UTC)
    # Not measured: the engine's first requests, each channel's first message.
    accepted = dict.fromkeys(channels, 0)
    for channel, _, status in await client.ask(
        {"rate": 5.0, "seconds": args.warmup_s, "conversations": 4, "run": f"{run}w"}
    ):
        accepted[channel] += status in (200, 202)
    await drain(db_url, since, args.drain_s)
    threads = {"service loop thread": [(os.getpid(), threading.get_native_id())]}
    threads |= {f"{name}'s main thread": [(pid, pid)] for pid, name in named.items()}
    lag, cpu_waits, cpu_by_process = LoopLag(), CpuWaits(threads), CpuByProcess(named)
    print("rate/s  channel   sent  ack_p50_ms  ack_p99_ms  ack_max_ms  refused  lost")
    first_over: float | None = None
    for rate in [float(r) for r in args.rates.split(",")]:
        lag.start()
        cpu_waits.start()
        cpu_by_process.start()
        plan = {"rate": rate, "seconds": args.seconds, "conversations": args.conversations}
        results = [tuple(r) for r in await client.ask(plan | {"run": f"{run}{rate:g}"})]
        lags, waits, spent = lag.stop(), cpu_waits.stop(), cpu_by_process.stop()
        still_open = await drain(db_url, since, args.drain_s)
        finals = await count_turns(db_url, since, final=True)
        for channel, _, status in results:
            accepted[channel] += status in (200, 202)
        lost = {c: "?" if still_open else accepted[c] - finals.get(c, 0) for c in channels}
        p99 = row(rate, "all", results, "?" if still_open else sum(map(int, lost.values())))
        # The first lcm(C, K) messages are each a conversation's first, which creates it.
        firsts = math.lcm(len(channels), args.conversations)
        row(rate, "firsts", results[:firsts], "")
        row(rate, "later", results[firsts:], "")
        for channel in channels if len(channels) > 1 else []:
            row(rate, channel, [r for r in results if r[0] == channel], lost[channel])
        if still_open:
            print(f"{'':6}  {still_open} turns still open after --drain-s {args.drain_s:g}")
        print(
            f"{'':6}  loop lag while they arrived: p50 {percentile(lags, 50):.1f}"
            f" p99 {percentile(lags, 99):.1f} max {max(lags, default=0):.1f} ms"
        )
        for line in waits:
            print(f"{'':6}  {line}")
        shares = ", ".join(f"{kind} {ms:.0f}" for kind, ms in spent.items())
        print(f"{'':6}  CPU ms while they arrived, by process: {shares}")
        if first_over is None and p99 > ACK_P99_GOAL_MS:
            first_over = rate
    if first_over is None:
        print(f"ack p99 stayed within {ACK_P99_GOAL_MS:g} ms at every rate tried")
    else:
        print(f"ack p99 first passed {ACK_P99_GOAL_MS:g} ms at {first_over:g} messages/s")
    print(f"load average {load_average()} at the end")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="25,50,100", help="messages per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="arrivals per rate")
    parser.add_argument("--conversations", type=int, default=40, help="per channel")
    parser.add_argument("--channels", default=",".join(CHANNELS), help="ways in, in turn")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--drain-s", type=float, default=300.0)
    parser.add_argument("--warmup-s", type=float, default=2.0, help="unmeasured arrivals at 5/s")
    parser.add_argument(
        "--database", help="a PostgreSQL server's URL: the run gets a new database there"
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--ingress-process",
        action="store_true",
        help="acknowledge in an ingress-only `botctl serve` of its own (PostgreSQL)",
    )
    parser.add_argument("--ingress-nice", type=int, default=0, help="e.g. -10 (needs root)")
    parser.add_argument(
        "--ingress-group",
        action="store_true",
        help="the ingress in a scheduling group of its own, --ingress-nice set on the group too",
    )
    asyncio.run(main(parser.parse_args()))
