"""The page's persona picker in real headless Chromium against the real app and engine.

Open while the conversation is empty; the first message starts the conversation with
the chosen persona, and from then on the picker shows it and is closed, across a reload;
a new conversation opens it again.
"""

from __future__ import annotations

from playwright.async_api import Browser, expect

from bot.engine.vllm_local import LocalVLLMEngine
from bot.turns.chat_format import ChatFormat
from tests.conftest import TEST_SYSTEM_PROMPT, MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.helpers import PERSONAS, PIRATE_PROMPT, conversation_personas
from tests.web.conftest import base_url, send


async def test_the_picker_starts_a_conversation_with_a_persona_then_closes(
    sqlite_url: str,
    make_client: MakeClient,
    engine: LocalVLLMEngine,
    chat_format: ChatFormat,
    browser: Browser,
) -> None:
    spy = RecordingEngine(engine)
    client = await make_client(sqlite_url, engine_override=spy, personas=PERSONAS)
    key = await issue_key(sqlite_url, "web-user")
    context = await browser.new_context(viewport={"width": 1000, "height": 800})
    page = await context.new_page()
    await page.goto(base_url(client) + f"#key={key}")

    picker = page.get_by_label("Persona")
    # The picker shows once the page has read the personas; enabled alone is too early.
    await expect(picker).to_be_visible()
    await expect(picker).to_be_enabled()
    options = await picker.locator("option").evaluate_all("(os) => os.map((o) => o.value)")
    assert options == ["", "pirate", "terse"]
    title = await picker.get_attribute("title")
    assert title is not None and "cannot change in the middle" in title

    await picker.select_option("pirate")
    await send(page, "Ahoy!")
    turns = page.locator(".turn")
    await expect(turns.nth(0).locator(".timing-summary")).to_be_visible(timeout=20_000)
    await expect(picker).to_be_disabled()
    await expect(picker).to_have_value("pirate")
    assert PIRATE_PROMPT in chat_format.decode(spy.calls[0].request.prompt_token_ids)

    await page.reload()
    await expect(turns).to_have_count(1)
    await expect(picker).to_be_disabled()
    await expect(picker).to_have_value("pirate")

    await page.get_by_role("button", name="New conversation").click()
    await expect(picker).to_be_enabled()
    await picker.select_option("")
    await send(page, "Hello")
    await expect(turns.nth(0).locator(".timing-summary")).to_be_visible(timeout=20_000)
    await expect(picker).to_be_disabled()
    assert TEST_SYSTEM_PROMPT in chat_format.decode(spy.calls[1].request.prompt_token_ids)
    personas = sorted((await conversation_personas(sqlite_url)).values(), key=str)
    assert personas == [None, "pirate"]
    await context.close()
