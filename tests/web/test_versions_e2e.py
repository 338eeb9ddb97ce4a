"""The page's regenerate, edit and "‹ 2/3 ›" versions, in real headless Chromium."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Browser, expect

from bot.engine.vllm_local import LocalVLLMEngine
from tests.conftest import MakeClient, issue_key
from tests.web.conftest import base_url, send


async def test_regenerate_edit_and_page_through_versions(
    sqlite_url: str,
    make_client: MakeClient,
    engine: LocalVLLMEngine,
    browser: Browser,
    artifacts: Path,
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "web-user")
    context = await browser.new_context(viewport={"width": 1000, "height": 800})
    page = await context.new_page()
    await page.goto(base_url(client) + f"#key={key}")
    await expect(page.get_by_label("Message")).to_be_visible()

    turns = page.locator(".turn")
    position = turns.nth(1).locator(".version-position")
    await send(page, "Hello there!")
    await expect(turns.nth(0).locator(".timing-summary")).to_be_visible(timeout=20_000)
    await send(page, "Tell me about Paris.")
    await expect(turns.nth(1).locator(".timing-summary")).to_be_visible(timeout=20_000)
    # Only the last turn can be regenerated or edited.
    await expect(page.get_by_role("button", name="Regenerate the reply")).to_have_count(1)
    await expect(turns.nth(0).get_by_role("button", name="Edit your text")).to_have_count(0)

    await turns.nth(1).get_by_role("button", name="Regenerate the reply").click()
    await expect(position).to_have_text("2/2", timeout=20_000)
    await expect(turns).to_have_count(2)
    await expect(turns.nth(1).locator(".timing-summary")).to_be_visible()
    await expect(turns.nth(1).locator(".bubble.user")).to_have_text("Tell me about Paris.")

    await turns.nth(1).get_by_role("button", name="Edit your text").click()
    await page.get_by_label("Edited text").fill("Tell me about Lyon.")
    await page.get_by_role("button", name="Save and answer").click()
    await expect(position).to_have_text("3/3", timeout=20_000)
    await expect(turns.nth(1).locator(".bubble.user")).to_have_text("Tell me about Lyon.")
    await expect(turns.nth(1).locator(".timing-summary")).to_be_visible()
    await page.screenshot(path=str(artifacts / "web-versions.png"), full_page=True)

    # The versions are stored: after a reload the page shows the same, and pages back.
    await page.reload()
    await expect(position).to_have_text("3/3")
    await expect(turns.nth(1).locator(".bubble.user")).to_have_text("Tell me about Lyon.")
    await turns.nth(1).get_by_role("button", name="Previous version").click()
    await expect(position).to_have_text("2/3")
    await expect(turns.nth(1).locator(".bubble.user")).to_have_text("Tell me about Paris.")
    await turns.nth(1).get_by_role("button", name="Previous version").click()
    await expect(position).to_have_text("1/3")
    await expect(turns.nth(1).get_by_role("button", name="Previous version")).to_be_disabled()
    await expect(turns).to_have_count(2)

    # A message now continues the version on screen.
    await send(page, "Thanks!")
    await expect(turns.nth(2).locator(".timing-summary")).to_be_visible(timeout=20_000)
    await page.reload()
    await expect(turns).to_have_count(3)
    await expect(position).to_have_text("1/3")
    await context.close()
