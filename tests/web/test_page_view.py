"""What a person sees of the chat page, measured in real headless Chromium.

The newest reply is in view while it streams and after it ends (0 px hidden
by the message box or the viewport, desktop and phone); the view follows the
reply unless the user scrolled up to read, and follows again once they are
back at the bottom; the header stays, on one line on a phone; the persona
picker only shows when there are personas; a pasted sign-in link signs in
a tab already open; dark mode follows the system.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from playwright.async_api import Browser, Page, expect

from bot.engine.vllm_local import LocalVLLMEngine
from tests.conftest import MakeClient, issue_key
from tests.engines import TrickleEngine
from tests.web.conftest import PHONE, base_url, send
from tests.web.view import (
    COLOURS_OF,
    FIRST_TURN_TOP,
    HEADER_BOXES,
    RECORD_WHILE_STREAMING,
    contrast,
    hidden_of_newest,
    luminance,
    on_one_line,
)

DESKTOP = {"width": 1280, "height": 800}
# Longer replies than the suite's default, so the page has to scroll while one streams.
LONG_REPLIES = {"max_tokens": 96, "temperature": 0.0, "top_p": 1.0}
# A first message tall enough that the conversation overflows the screen at once.
TALL = "\n".join(f"Line {n} of a long message" for n in range(40))
TURN_ENDED = ".bubble.bot:not(.streaming) + .turn-controls"


async def signed_in(
    browser: Browser, client: Any, key: str, viewport: dict[str, int], **options: Any
) -> Page:
    context = await browser.new_context(viewport=viewport, **options)
    page = await context.new_page()
    await page.goto(base_url(client) + f"#key={key}")
    await expect(page.get_by_label("Message")).to_be_visible()
    return page


async def reply_ended(page: Page, index: int) -> None:
    turn = page.locator(".turn").nth(index)
    await expect(turn.get_by_role("button", name="Regenerate the reply")).to_be_visible(
        timeout=30_000
    )


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280x800", "390x844"])
async def test_the_newest_reply_is_never_hidden(
    sqlite_url: str,
    make_client: MakeClient,
    engine: LocalVLLMEngine,
    browser: Browser,
    viewport: dict[str, int],
) -> None:
    client = await make_client(
        sqlite_url, engine_override=TrickleEngine(engine, 3, 0.05), generation=LONG_REPLIES
    )
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key, viewport)

    await send(page, TALL)
    await reply_ended(page, 0)
    after_first = await hidden_of_newest(page)
    await page.evaluate(RECORD_WHILE_STREAMING)
    await send(page, "And now a short question?")
    await reply_ended(page, 1)
    frames = [f for f in await page.evaluate("window.streamingFrames") if f is not None]
    after = await hidden_of_newest(page)

    assert after_first["hidden"] == 0, after_first
    assert len(frames) >= 10, f"too few frames while streaming: {len(frames)}"
    # The measure means something only if the reply fits between header and message box.
    assert all(f["height"] <= f["room"] for f in frames), frames[-1]
    hidden = [f["hidden"] for f in frames]
    assert max(hidden) == 0, f"px of the streaming reply hidden, per frame: {hidden}"
    assert after["hidden"] == 0, after
    await expect(page.get_by_role("button", name="Edit your text")).to_be_in_viewport(ratio=1)
    # The page scrolled (the first message is far above) and the header stayed.
    assert await page.evaluate(FIRST_TURN_TOP) < 0
    header = await page.locator("header").bounding_box()
    assert header is not None and header["y"] == 0
    await page.context.close()


async def test_the_view_stops_following_when_the_user_scrolls_up(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, browser: Browser
) -> None:
    client = await make_client(
        sqlite_url, engine_override=TrickleEngine(engine, 2, 0.08), generation=LONG_REPLIES
    )
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key, DESKTOP)
    await send(page, TALL)
    await reply_ended(page, 0)

    await send(page, "Tell me a long story.")
    streaming = page.locator(".turn").nth(1).locator(".bubble.bot.streaming .reply")
    await expect(streaming).not_to_have_text("", timeout=20_000)
    # The user scrolls up to read an earlier message while the reply goes on.
    await page.mouse.move(400, 300)
    followed = await page.evaluate(FIRST_TURN_TOP)
    await page.mouse.wheel(0, -300)
    await asyncio.sleep(0.3)
    reading = await page.evaluate(FIRST_TURN_TOP)
    assert reading > followed + 200, (followed, reading)
    grown_from = len(await streaming.inner_text())
    positions = []
    for _ in range(10):
        await asyncio.sleep(0.15)
        positions.append(await page.evaluate(FIRST_TURN_TOP))
    assert len(await streaming.inner_text()) > grown_from, "the reply did not grow meanwhile"
    assert positions == [reading] * len(positions), "the view moved away from what they read"

    # Back at the bottom, the view follows the reply again to its end.
    await page.mouse.wheel(0, 5000)
    await asyncio.sleep(0.2)
    await page.evaluate(RECORD_WHILE_STREAMING)
    await reply_ended(page, 1)
    frames = [f for f in await page.evaluate("window.streamingFrames") if f is not None]
    assert frames and max(f["hidden"] for f in frames) == 0, frames
    assert (await hidden_of_newest(page))["hidden"] == 0
    await page.context.close()


async def test_the_header_stays_on_one_line_on_a_phone(
    sqlite_url: str, make_client: MakeClient, browser: Browser
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "someone-with-a-rather-long-name")
    page = await signed_in(browser, client, key, PHONE)
    measured = await page.evaluate(HEADER_BOXES)
    assert on_one_line(measured), measured
    assert measured["header"]["height"] <= 56, measured
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await page.context.close()


async def test_the_persona_picker_hides_without_personas(
    sqlite_url: str, make_client: MakeClient, browser: Browser
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "web-user")
    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    await page.goto(base_url(client))
    await expect(page.get_by_label("API key")).to_be_visible()
    await expect(page.get_by_label("Persona")).to_be_hidden()
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_label("Message")).to_be_visible()
    await expect(page.get_by_label("Persona")).to_be_hidden()
    await page.get_by_role("button", name="New conversation").click()
    await expect(page.get_by_label("Persona")).to_be_hidden()
    await context.close()


async def test_a_pasted_sign_in_link_signs_in_an_open_tab(
    sqlite_url: str, make_client: MakeClient, browser: Browser
) -> None:
    client = await make_client(sqlite_url)
    alice = await issue_key(sqlite_url, "alice")
    bob = await issue_key(sqlite_url, "bob")
    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    await page.goto(base_url(client))
    await expect(page.get_by_label("API key")).to_be_visible()

    # The link `make run` prints, pasted into this tab's address bar: only the fragment
    # changes, so the page is not loaded again.
    await page.goto(base_url(client) + f"#key={alice}")
    await expect(page.get_by_label("Message")).to_be_visible()
    assert "#" not in page.url and alice not in page.url
    assert await page.evaluate("localStorage.getItem('bot.apiKey')") == alice
    assert alice not in await page.evaluate("location.href")

    # Another key's link in the same (signed-in) tab signs in as that key.
    await page.goto(base_url(client) + f"#key={bob}")
    await expect(page.locator("header")).to_contain_text("bob")
    assert bob not in page.url
    assert await page.evaluate("localStorage.getItem('bot.apiKey')") == bob
    await context.close()


async def test_dark_mode_follows_the_system(
    sqlite_url: str, make_client: MakeClient, browser: Browser
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key, DESKTOP, color_scheme="dark")
    await send(page, "Hello!")
    await reply_ended(page, 0)

    for scheme, dark in (("dark", True), ("light", False)):
        await page.emulate_media(color_scheme=scheme)
        for selector in ("body", "header h1", ".bubble.user", ".bubble.bot .reply", "#message"):
            seen = await page.evaluate(COLOURS_OF, selector)
            assert seen is not None, selector
            background = luminance(seen["background"])
            assert background < 0.05 if dark else background > 0.7, (scheme, selector, seen)
            assert contrast(seen["text"], seen["background"]) >= 4.5, (scheme, selector, seen)
    await page.context.close()
