"""The app served the way ``botctl serve`` serves it, for tests where that differs from aiohttp's
test server (which cancels a handler when its client disconnects; production does not)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from bot.http.keys import SERVER
from bot.serve import main_runner


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free loopback port with the production runner; yields its base URL."""
    runner = main_runner(app, app[SERVER])
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
