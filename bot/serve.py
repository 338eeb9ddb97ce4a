"""``botctl serve``: run the app until SIGTERM/SIGINT, then drain and exit 0.

Lifecycle, as systemd sees it (``Type=notify``):

1. the app starts (database engine, inference engine, turn recovery);
2. the listening sockets open; once ``/readyz``'s checks pass (database and
   engine answer) ``READY=1`` is sent;
3. while running, ``WATCHDOG=1`` is sent at half the watchdog interval, but
   only while the engine answers its health check, so a dead engine gets the
   unit restarted;
4. on SIGTERM: ``STOPPING=1``, the sockets close, running turns get
   ``server.shutdown_grace_s`` to finish and the rest are cancelled and
   recorded (``bot.http.ops.drain``), then everything is released and the
   process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from bot.app import create_app
from bot.config import ServerSettings, Settings
from bot.engine.base import InferenceEngine
from bot.http.deadlines import app_runner
from bot.http.keys import ENGINE, TURNS
from bot.http.ops import admin_app, readiness
from bot.ops import systemd
from bot.turns.chat_format import ChatFormat

log = structlog.get_logger(__name__)

# After the drain, open connections (idle keep-alives, a stuck client) get this long.
CONNECTION_CLOSE_TIMEOUT_S = 5.0
READY_WAIT_S = 60.0

Addresses = list[Any]


def main_runner(app: web.Application, server: ServerSettings) -> web.AppRunner:
    """The runner of the main app, as ``serve`` runs it (tests serve the app the same way).

    The slow-client deadlines apply (``bot.http.deadlines``); aiohttp's
    ``handler_cancellation`` stays off, so a handler is not cancelled when its
    client disconnects (``bot.http.readers`` notices).
    """
    return app_runner(
        app,
        server,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=CONNECTION_CLOSE_TIMEOUT_S,
    )


async def _wait_ready(app: web.Application) -> None:
    """Until the readiness checks pass (the engine may still be warming its first request)."""
    reason: str | None = "not checked"
    async with asyncio.timeout(READY_WAIT_S):
        while True:
            reason = await readiness(app)
            if reason is None:
                return
            log.info("waiting_until_ready", reason=reason)
            await asyncio.sleep(0.5)


async def _watchdog(app: web.Application, interval_s: float) -> None:
    engine = app[ENGINE]
    runs_turns = app[TURNS].runs_turns  # an ingress-only process has no engine to watch
    while True:
        try:
            async with asyncio.timeout(interval_s):
                if runs_turns:
                    await engine.check_health()
        except Exception as exc:
            # No ping: if this lasts, systemd kills and restarts the unit (Restart=on-failure).
            log.error("watchdog_engine_unhealthy", error=f"{type(exc).__name__}: {exc}")
        else:
            systemd.notify("WATCHDOG=1")
        await asyncio.sleep(interval_s)


async def serve(
    settings: Settings,
    *,
    engine: InferenceEngine | None = None,
    chat_format: ChatFormat | None = None,
    on_ready: Callable[[Addresses, Addresses], None] | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit code (0 after a clean drain).

    ``engine``/``chat_format`` let tests share theirs; ``on_ready`` receives
    the bound (main, admin) addresses once ready (port 0 picks free ports).
    """
    app = await create_app(settings, engine=engine, chat_format=chat_format)
    runner = main_runner(app, settings.server)
    admin_runner: web.AppRunner | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    watchdog: asyncio.Task[None] | None = None
    try:
        systemd.notify("STATUS=starting: database, engine, turn recovery")
        await runner.setup()
        await web.TCPSite(runner, settings.server.host, settings.server.port).start()
        if settings.server.admin_port is not None:
            admin_runner = app_runner(
                admin_app(app), settings.server, handle_signals=False, access_log=None
            )
            await admin_runner.setup()
            await web.TCPSite(
                admin_runner, settings.server.admin_host, settings.server.admin_port
            ).start()
        await _wait_ready(app)
        addresses = runner.addresses
        admin_addresses = admin_runner.addresses if admin_runner else []
        systemd.notify("READY=1", f"STATUS=serving on {addresses}")
        log.info("service_ready", addresses=addresses, admin_addresses=admin_addresses)
        interval = systemd.watchdog_interval_s()
        if interval is not None:
            watchdog = asyncio.create_task(_watchdog(app, interval), name="systemd-watchdog")
        if on_ready is not None:
            on_ready(addresses, admin_addresses)
        await stop.wait()
        log.info("signal_received", drain_grace_s=settings.server.shutdown_grace_s)
        systemd.notify("STOPPING=1", "STATUS=draining turns")
    finally:
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        await runner.cleanup()  # closes the sockets, drains turns, releases engine and database
        if admin_runner is not None:
            await admin_runner.cleanup()
        for signum in signals:
            loop.remove_signal_handler(signum)
    log.info("service_stopped")
    return 0
