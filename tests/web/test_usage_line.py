"""The page's usage line in real headless Chromium: today's messages and tokens, the limit."""

from __future__ import annotations

import math
from pathlib import Path

from playwright.async_api import Browser, expect

from tests.conftest import MakeClient, issue_key
from tests.helpers import auth
from tests.web.conftest import PHONE, base_url, send

DAILY = 20_000


def _percent(share: float) -> str:
    return f"{math.floor(share * 100 + 0.5)}%"  # JavaScript's Math.round


async def test_the_usage_line_follows_each_reply(
    sqlite_url: str, make_client: MakeClient, browser: Browser, artifacts: Path
) -> None:
    client = await make_client(sqlite_url, limits={"tokens_per_day": DAILY})
    key = await issue_key(sqlite_url, "web-user")
    context = await browser.new_context(viewport={"width": 1000, "height": 800})
    page = await context.new_page()
    await page.goto(base_url(client) + f"#key={key}")
    line = page.get_by_label("Usage today")
    await expect(line).to_have_text(
        "Today (UTC): 0 messages · 0 prompt tokens, - from cache · 0 generated · "
        f"limit: 0 of {DAILY:,} tokens (0%)"
    )

    turns = page.locator(".turn")
    await send(page, "Hello there!")
    await expect(turns.nth(0).locator(".timing-summary")).to_be_visible(timeout=30_000)
    await expect(line).to_contain_text("Today (UTC): 1 message · ")
    await send(page, "And how are you?")
    await expect(turns.nth(1).locator(".timing-summary")).to_be_visible(timeout=30_000)
    await expect(line).to_contain_text("Today (UTC): 2 messages · ")

    today = (await (await client.get("/v1/usage", headers=auth(key))).json())["today"]
    assert today["cached_tokens"] > 0  # the second prompt re-read the first from the cache
    counted, prompt = today["counted_tokens"], today["prompt_tokens"]
    await expect(line).to_have_text(
        f"Today (UTC): 2 messages · {prompt:,} prompt tokens, "
        f"{_percent(today['cache_share'])} from cache · "
        f"{today['completion_tokens']:,} generated · "
        f"limit: {counted:,} of {DAILY:,} tokens ({_percent(counted / DAILY)})"
    )

    await page.set_viewport_size(PHONE)
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await page.screenshot(path=str(artifacts / "web-usage-line.png"), full_page=True)

    await page.get_by_role("button", name="Sign out").click()
    await expect(line).to_be_hidden()
    await context.close()
