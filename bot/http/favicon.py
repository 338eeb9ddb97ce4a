"""``GET /favicon.ico``: the icon browsers ask every site for (a chat bubble, 16-48 px).

Without it every page load logs a 404. The file is read once at start-up and
served with a day's cache.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

FAVICON = Path(__file__).with_name("favicon.ico")
CACHE_CONTROL = "public, max-age=86400"


def setup(app: web.Application) -> None:
    icon = FAVICON.read_bytes()

    async def favicon(request: web.Request) -> web.Response:
        return web.Response(
            body=icon,
            content_type="image/x-icon",
            headers={"Cache-Control": CACHE_CONTROL, "X-Content-Type-Options": "nosniff"},
        )

    app.router.add_get("/favicon.ico", favicon)
