"""A real model's Markdown on the chat page, in headless Chromium: code comes out as code."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from tests.conftest import MakeClient, issue_key

pytestmark = [pytest.mark.realmodel, pytest.mark.browser]


async def test_a_code_answer_is_rendered_as_a_code_block(
    sqlite_url: str, make_real_client: MakeClient, browser: Browser
) -> None:
    client = await make_real_client(sqlite_url)
    key = await issue_key(sqlite_url, "web-user")
    context = await browser.new_context()
    page = await context.new_page()
    await page.goto(str(client.make_url("/")) + f"#key={key}")
    await page.get_by_label("Message").fill("Write a Python function that adds two numbers.")
    await page.get_by_label("Message").press("Enter")
    turn = page.locator(".turn").nth(0)
    # The one-line timing summary comes when the reply has ended.
    await expect(turn.locator(".timing-summary")).to_be_visible(timeout=60_000)
    code = turn.locator(".reply pre code")
    await expect(code).to_contain_text("def ")
    assert "```" not in await turn.locator(".reply").inner_text()
    await context.close()
