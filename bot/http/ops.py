"""Operations endpoints and the SIGTERM drain: ``/healthz``, ``/readyz``, ``/metrics``.

* ``/healthz``: the process answers (liveness).
* ``/readyz``: the service started, is not draining, and the database and the
  engine answer (work either completed a moment ago, or a check's own round trip:
  ``bot.ops.recent_answer``); else 503 with the reason (readiness: load balancers,
  Docker's HEALTHCHECK, systemd's READY=1).
* ``/metrics``: Prometheus text. On the public port it needs an admin-scope
  API key; the admin listen address (``server.admin_port``) serves all three
  without a key, for a scraper on a private network.

``setup`` also hooks the drain into ``on_shutdown``: aiohttp runs it after the
listening sockets close and before it waits for open requests, so SSE readers
get their final event instead of being cut off.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.apikeys import Principal
from bot.engine.upstream_metrics import UpstreamMetrics
from bot.http.key_gate import Scope, requires
from bot.http.keys import DB_ANSWERS, DB_PROBE, ENGINE, SERVER, TURNS
from bot.ops.metrics import CONTENT_TYPE, BotMetrics

log = structlog.get_logger(__name__)

READY_CHECK_TIMEOUT_S = 3.0
"""How long a check waits for a dependency's answer, counting only time this process's
event loop was free to read it (``_answered_within``)."""
LAG_STEP_S = 0.1
"""How often a check looks at its clock: a step that took longer than this was the loop's
lag, and only the step itself counts against the dependency."""
READY_CHECK_CEILING_S = 8.0
"""The longest a check waits on the wall clock, however late the loop: an answer to a
load balancer must come at some point (and the handler not pile up)."""


@dataclass
class OpsState:
    started: bool = False
    draining: bool = False
    database_check: asyncio.Task[None] | None = None
    """The probe's round trip in flight: concurrent checks wait for this one."""


METRICS = web.AppKey("metrics", BotMetrics)
OPS_STATE = web.AppKey("ops_state", OpsState)
MAIN_APP = web.AppKey("main_app", web.Application)


def _main(request: web.Request) -> web.Application:
    return request.app.get(MAIN_APP, request.app)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def readiness(app: web.Application) -> str | None:
    """None when ready, else the reason, fit for anyone to read.

    Which layer fails is public; why it fails (an exception's text may name an
    internal URL or host) goes to the log only, with the request id.
    """
    state = app[OPS_STATE]
    if state.draining:
        return "draining: the service is shutting down"
    if not state.started:
        return "starting: the engine or the turn service is not up yet"
    checks: dict[str, Coroutine[Any, Any, None]] = {}
    # Statements that just completed say so without a round trip, which under load would
    # wait behind them (bot.ops.recent_answer).
    if not app[DB_ANSWERS].fresh():
        checks["database"] = _joined_database_check(state, app[DB_PROBE])
    if app[TURNS].runs_turns:  # ingress-only: no engine here, the database is all it needs
        checks["engine"] = app[ENGINE].check_health()
    # At once: a probe waits for the slower of the two, not for their sum (a load
    # balancer's or Docker's probe gives up after a few seconds of its own).
    outcomes = await asyncio.gather(
        *(_answered_within(check, READY_CHECK_TIMEOUT_S) for check in checks.values()),
        return_exceptions=True,
    )
    for layer, outcome in zip(checks, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            log.warning("not_ready", layer=layer, error=f"{type(outcome).__name__}: {outcome}")
            return f"{layer}: not answering"
    return None


async def _answered_within(check: Coroutine[Any, Any, None], budget_s: float) -> None:
    """Run ``check``; raise ``TimeoutError`` once it has waited ``budget_s`` in steps of
    ``LAG_STEP_S``, a step that took longer counting as the step alone, or at the latest
    after ``READY_CHECK_CEILING_S`` of wall clock.

    A plain timeout counts the time the loop was busy elsewhere against the dependency:
    with 150 requests arriving at once the loop fell seconds behind, the database's answer
    sat unread in the socket, and a check that took milliseconds of the server's time
    reported "not answering" (one ``/readyz`` in 15, in one CI run of five). Here the
    loop's lag beyond each step is not counted: a dependency that does not answer is
    still reported after ``budget_s``, later by the loop's lag, never after the ceiling.
    """
    task = asyncio.create_task(check)
    # From here on its outcome is retrieved whoever gives up on it (bot.http.ops._unwound).
    _unwinding.add(task)
    task.add_done_callback(_unwound)
    try:
        async with asyncio.timeout(READY_CHECK_CEILING_S):
            for _ in range(math.ceil(budget_s / LAG_STEP_S)):
                await asyncio.wait((task,), timeout=LAG_STEP_S)
                if task.done():
                    task.result()  # its exception, if it raised
                    return
        raise TimeoutError(f"no answer in {budget_s} s of the event loop's time")
    finally:
        # A check given up on unwinds on its own: a cancelled asyncpg statement whose server
        # does not answer took 2 s more to give its connection up, and the answer is due now.
        task.cancel()


_unwinding: set[asyncio.Task[None]] = set()
"""Checks running or unwinding: the loop keeps only weak references to tasks."""


def _unwound(task: asyncio.Task[None]) -> None:
    _unwinding.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.debug("check_unwound", error=type(task.exception()).__name__)


async def _joined_database_check(state: OpsState, probe: AsyncEngine) -> None:
    """Wait for the probe's round trip in flight, or start one.

    The probe keeps one connection. Probes that came together (a load balancer's,
    Docker's, an orchestrator's, a burst of them under load) each checked it out:
    the second opened a connection of its own, one more server process opened and
    closed per probe, and the third waited for either, past its timeout: "not
    answering" from a database that answered. Together they share one statement's
    answer.
    """
    task = state.database_check
    if task is None or task.done():
        task = state.database_check = asyncio.create_task(_database_answers(probe))
        _unwinding.add(task)
        task.add_done_callback(_unwound)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        # A check gave up on it: the statement unwinds on its own, as a lone check's did.
        task.cancel()
        raise


async def _database_answers(probe: AsyncEngine) -> None:
    """One round trip on the probe's own connection (``create_probe_engine``); raises if
    the database does not answer."""
    for last_try in (False, True):
        try:
            # Its own connection: a check queued behind busy requests would say "not ready".
            async with probe.connect() as connection:
                await connection.execute(text("SELECT 1"))
            return
        except DBAPIError as exc:
            # The server closed the kept connection since the last check (a restart, a
            # kill): that says nothing of the database now, a new connection does.
            if last_try or not exc.connection_invalidated:
                raise


async def readyz(request: web.Request) -> web.Response:
    reason = await readiness(_main(request))
    if reason is not None:
        return web.json_response({"status": "not_ready", "reason": reason}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=_main(request)[METRICS].render(), headers={"Content-Type": CONTENT_TYPE}
    )


@requires(Scope.ADMIN)
async def metrics_with_key(request: web.Request, principal: Principal) -> web.Response:
    return await metrics(request)


def setup(app: web.Application) -> BotMetrics:
    """Add the ops routes, the metrics and the drain to the main app; returns the metrics."""
    turns = app[TURNS]
    app[METRICS] = bot_metrics = BotMetrics(in_flight=lambda: turns.in_flight)
    # A remote engine counts its calls by upstream (bot.engine.upstream_metrics).
    upstream = getattr(app[ENGINE], "upstream_metrics", None)
    if isinstance(upstream, UpstreamMetrics):
        bot_metrics.more_registries.append(upstream.registry)
    app[OPS_STATE] = OpsState()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_with_key)

    async def rate_limit_subscription(app: web.Application):  # type: ignore[no-untyped-def]
        unsubscribe = bot_metrics.listen_for_rate_limits()
        yield
        unsubscribe()

    async def mark_started(app: web.Application) -> None:
        app[OPS_STATE].started = True

    app.cleanup_ctx.append(rate_limit_subscription)
    app.on_startup.append(mark_started)
    app.on_shutdown.append(drain)
    return bot_metrics


async def drain(app: web.Application) -> None:
    """Let running turns finish within the grace period, cancel the rest, say what happened.

    Cancelled turns are recorded by the runner as failed with error class
    ``cancelled`` (their own ``turn`` lines); queued turns stay queued and the
    next start resumes them.
    """
    state = app[OPS_STATE]
    state.draining = True
    grace = app[SERVER].shutdown_grace_s
    turns = app[TURNS]
    in_flight = turns.in_flight
    started = time.perf_counter()
    log.info("drain_started", in_flight=in_flight, grace_s=grace)
    cancelled = await turns.shutdown(grace)
    log.info(
        "drain_finished",
        in_flight=in_flight,
        finished=max(0, in_flight - cancelled),
        cancelled=cancelled,
        drain_ms=round((time.perf_counter() - started) * 1000, 1),
    )


def admin_app(main: web.Application) -> web.Application:
    """The admin listen address: ops endpoints of ``main``, no key (bind it privately)."""
    app = web.Application()
    app[MAIN_APP] = main
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app
