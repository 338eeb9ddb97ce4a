"""Serves the chat page at ``/`` and its files at ``/static/``.

The page signs in with an API key it keeps in the browser's localStorage and
calls the public API with it (``Authorization`` header). ``make run`` hands the
key over in the URL *fragment* (``/#key=...``), which browsers never send to
the server, and the page removes it from the address bar at once: the key
never appears in a request line or an access log.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {
    path.relative_to(STATIC_DIR).as_posix(): path
    for path in STATIC_DIR.rglob("*")
    if path.is_file()
}
"""Every file the page may load, by its path under ``static/`` (``vendor/marked.esm.js``)."""

# Only our own files, no inline script, no framing, no referrer: a page holding an API key.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(
        STATIC_DIR / "index.html", headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"}
    )


async def static_file(request: web.Request) -> web.StreamResponse:
    """One of the page's files; any other name is a 404 (a JSON one, like every refusal).

    The files are listed at start-up: a request names one of them or gets a 404,
    so nothing it names can reach outside the folder.
    """
    path = STATIC_FILES.get(request.match_info["filename"])
    if path is None:
        raise web.HTTPNotFound(reason="no such file")
    return web.FileResponse(path, headers={"X-Content-Type-Options": "nosniff"})


def setup(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/static/{filename:.+}", static_file)
