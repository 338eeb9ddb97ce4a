"""The page's conveniences in real headless Chromium: the list of conversations to switch
between (a drawer on a phone; switching mid-reply; a refused list), the one-line timing
summary that opens into the detail, a copy button on code, and the mark of a reply cut at
the token cap.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from playwright.async_api import Browser, Page, Route, expect

from bot.engine.vllm_local import LocalVLLMEngine
from bot.http.openapi import documented_paths
from tests.conftest import MakeClient, issue_key
from tests.engines import TrickleEngine
from tests.web.conftest import PHONE, base_url, send

DESKTOP = {"width": 1280, "height": 800}
CODE_REPLY = "Run this:\n\n```python\nprint('a < b & c')\nx = 1\n```\n\nand `inline` too."


async def signed_in(browser: Browser, client: object, key: str) -> Page:
    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    await page.goto(base_url(client) + f"#key={key}")
    await expect(page.get_by_label("Message")).to_be_visible()
    return page


async def reply_ended(page: Page, index: int) -> None:
    turn = page.locator(".turn").nth(index)
    await expect(turn.get_by_role("button", name="Regenerate the reply")).to_be_visible(
        timeout=30_000
    )


async def test_the_conversation_list_switches_between_conversations(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, browser: Browser
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key)
    listed = page.get_by_role("navigation", name="Conversations").get_by_role("button")

    await send(page, "Planning a trip to Lisbon in May")
    await reply_ended(page, 0)
    await expect(listed).to_have_text(["Planning a trip to Lisbon in May"])
    await page.get_by_role("button", name="New conversation").click()
    await send(page, "Sourdough starter questions")
    await reply_ended(page, 0)
    await expect(listed).to_have_text(
        ["Sourdough starter questions", "Planning a trip to Lisbon in May"]
    )
    current = page.locator("[aria-current='true']")
    await expect(current).to_have_text("Sourdough starter questions")

    await listed.filter(has_text="Lisbon").click()
    turns = page.locator(".turn")
    await expect(turns).to_have_count(1)
    await expect(turns.nth(0).locator(".bubble.user")).to_have_text(
        "Planning a trip to Lisbon in May"
    )
    await expect(current).to_have_text("Planning a trip to Lisbon in May")
    # It is the conversation the page continues, also after a reload.
    await send(page, "And in June?")
    await reply_ended(page, 1)
    await page.reload()
    await expect(turns).to_have_count(2)
    await expect(listed.first).to_have_text("Planning a trip to Lisbon in May")

    # On a phone the list is a drawer, opened from the header, closed by a choice.
    await page.set_viewport_size(PHONE)
    await expect(listed.first).to_be_hidden()
    await page.get_by_role("button", name="Conversations").click()
    await expect(listed).to_have_count(2)
    await listed.filter(has_text="Sourdough").click()
    await expect(listed.first).to_be_hidden()
    await expect(turns.nth(0).locator(".bubble.user")).to_have_text("Sourdough starter questions")
    await page.context.close()


async def test_switching_away_from_a_streaming_reply_leaves_it_behind(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, browser: Browser
) -> None:
    client = await make_client(
        sqlite_url,
        engine_override=TrickleEngine(engine, 2, 0.08),
        generation={"max_tokens": 64, "temperature": 0.0, "top_p": 1.0},
    )
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key)
    listed = page.get_by_role("navigation", name="Conversations").get_by_role("button")
    turns = page.locator(".turn")
    await send(page, "First conversation")
    await reply_ended(page, 0)
    await page.get_by_role("button", name="New conversation").click()
    await send(page, "Second conversation, a long answer please")
    await expect(page.locator(".bubble.bot.streaming .reply")).not_to_have_text("", timeout=20_000)

    # Mid-reply, the user opens the other conversation: it shows alone, ready for a message.
    await listed.filter(has_text="First conversation").click()
    await expect(turns).to_have_count(1)
    await expect(turns.nth(0).locator(".bubble.user")).to_have_text("First conversation")
    await expect(page.get_by_role("button", name="Send")).to_be_enabled()
    await expect(page.get_by_role("button", name="Stop the reply")).to_be_hidden()
    first_reply = await turns.nth(0).locator(".reply").inner_text()
    await asyncio.sleep(1.0)  # the other reply streams on meanwhile, out of sight
    await expect(turns).to_have_count(1)
    await expect(turns.nth(0).locator(".reply")).to_have_text(first_reply)

    # Back in the second conversation the reply is there (followed again, or ended).
    await listed.filter(has_text="Second conversation").click()
    await expect(turns.nth(0).locator(".bubble.user")).to_have_text(
        "Second conversation, a long answer please"
    )
    await reply_ended(page, 0)
    await expect(turns).to_have_count(1)
    await page.context.close()


async def test_the_page_chats_on_when_the_list_is_refused(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, browser: Browser
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "web-user")
    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    errors: list[object] = []
    page.on("pageerror", lambda error: errors.append(error))

    async def unavailable(route: Route) -> None:
        await route.fulfill(
            status=503,
            content_type="application/json",
            body='{"error": "storage_unavailable", "reason": "the database did not answer"}',
        )

    await page.route(re.compile(r".*/v1/conversations(\?.*)?$"), unavailable)
    await page.goto(base_url(client) + f"#key={key}")
    await send(page, "Still here?")
    await reply_ended(page, 0)
    listed = page.get_by_role("navigation", name="Conversations").get_by_role("button")
    await expect(listed).to_have_count(0)
    await expect(page.get_by_role("alert")).to_be_hidden()
    assert not errors, errors
    await context.close()


async def test_the_timing_is_one_small_line_that_opens_into_the_detail(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, browser: Browser
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key)
    await send(page, "Hello there!")
    await reply_ended(page, 0)

    timing = page.locator(".turn .timing")
    bar = timing.locator(".timing-bar")
    await expect(bar).to_be_hidden()
    box = await timing.bounding_box()
    # One line of small text: a line is about 1.2 times the font size, two would be 2.4.
    font = await timing.evaluate("(el) => parseFloat(getComputedStyle(el).fontSize)")
    assert font <= 13, font
    assert box is not None and box["height"] <= 2 * font, (box, font)
    summary = timing.locator("summary")
    await expect(summary).to_contain_text("tok/s")

    await summary.click()
    await expect(bar).to_be_visible()
    await expect(timing.locator(".timing-facts")).to_contain_text("from cache")
    await summary.click()
    await expect(bar).to_be_hidden()
    await page.context.close()


async def test_a_code_block_has_a_copy_button(page: Page) -> None:
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await page.evaluate(
        """async (text) => {
            const { renderMarkdown } = await import('/static/markdown.js');
            const box = document.createElement('div');
            box.className = 'reply';
            box.replaceChildren(renderMarkdown(text));
            document.body.append(box);
        }""",
        CODE_REPLY,
    )
    copy = page.get_by_role("button", name="Copy code")
    await expect(copy).to_have_count(1)
    await copy.click()
    copied = await page.evaluate("navigator.clipboard.readText()")
    assert copied == "print('a < b & c')\nx = 1\n"
    await expect(copy).to_have_text("Copied")


async def test_a_cut_reply_is_marked_and_offers_continue(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, browser: Browser
) -> None:
    # Four tokens: the demo model's reply is always cut at the cap.
    client = await make_client(
        sqlite_url, generation={"max_tokens": 4, "temperature": 0.0, "top_p": 1.0}
    )
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key)
    await send(page, "Hello there!")
    await reply_ended(page, 0)
    turn = page.locator(".turn").nth(0)
    await expect(turn.locator(".cut-mark")).to_be_visible()
    await expect(turn.locator(".cut-mark")).to_contain_text("cut")
    await expect(turn.get_by_role("button", name="Continue the reply")).to_be_visible()
    # After a reload too: the mark comes from the stored turn.
    await page.reload()
    await expect(turn.locator(".cut-mark")).to_be_visible()
    await page.context.close()


CONTINUE = ("post", "/v1/turns/{turn_id}/continue")


@pytest.mark.skipif(
    CONTINUE not in documented_paths(),
    reason="POST /v1/turns/{id}/continue is not in this build (it comes with resumable replies)",
)
async def test_continue_carries_a_cut_reply_on_in_place(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine, browser: Browser
) -> None:
    # Twelve tokens: the demo model's reply to this message is cut, and its next twelve
    # tokens decode to visible text.
    client = await make_client(
        sqlite_url, generation={"max_tokens": 12, "temperature": 0.0, "top_p": 1.0}
    )
    key = await issue_key(sqlite_url, "web-user")
    page = await signed_in(browser, client, key)
    await send(page, "Hello there!")
    await reply_ended(page, 0)
    turn = page.locator(".turn").nth(0)
    await expect(turn.locator(".cut-mark")).to_be_visible()
    cut = await turn.locator(".reply").inner_text()

    await turn.get_by_role("button", name="Continue the reply").click()
    await expect(turn.locator(".reply")).not_to_have_text(cut, timeout=30_000)
    await reply_ended(page, 0)
    whole = await turn.locator(".reply").inner_text()
    assert whole.startswith(cut.rstrip()) and len(whole) > len(cut), (cut, whole)
    await expect(page.locator(".turn")).to_have_count(1)
    # The cut reply's tokens came from the prefix cache: only the rest was generated.
    await turn.locator(".timing-summary").click()
    facts = await turn.locator(".timing-facts").inner_text()
    cached = re.search(r"prompt \d+ tok: (\d+) from cache", facts)
    assert cached is not None and int(cached.group(1)) > 0, facts

    await page.reload()
    await expect(turn.locator(".reply")).to_have_text(whole)
    await page.context.close()
