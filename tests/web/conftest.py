"""Headless Chromium (Debian's package, never a download) driven by Playwright's async API."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page

from bot.web.routes import STATIC_DIR, index

CHROMIUM = Path(os.environ.get("BOT_TEST_CHROMIUM", "/usr/bin/chromium"))
# This machine has no network: every background connection Chromium would make must be off.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():  # noqa: ASYNC240 - one stat at session start
        message = f"{CHROMIUM} not found: apt-get install -y chromium (.ci/run does)"
        if os.environ.get("BOT_TEST_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    # Never let Playwright fetch a browser of its own.
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """The page's own files alone, served on loopback: for its modules, run in the browser."""
    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC_DIR)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    context = await browser.new_context()
    opened = await context.new_page()
    errors: list[Any] = []
    opened.on("pageerror", lambda error: errors.append(error))
    await opened.goto(str(server.make_url("/")))
    yield opened
    assert not errors, errors
    await context.close()
    await server.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


PHONE = {"width": 390, "height": 844}
"""A phone's viewport: the page must fit it without sideways scrolling."""


def base_url(client: Any) -> str:
    return str(client.make_url("/"))


async def send(page: Page, text: str) -> None:
    await page.get_by_label("Message").fill(text)
    await page.get_by_label("Message").press("Enter")
