"""The chat page in real headless Chromium against the real app and engine on loopback."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.async_api import Browser, expect

from bot.engine.vllm_local import LocalVLLMEngine
from tests.conftest import MakeClient, issue_key
from tests.engines import DownEngine, TrickleEngine
from tests.web.conftest import PHONE, base_url, send

# Records every length the first reply had while it streamed, before the timing bar appeared.
WATCH_REPLIES = """
() => {
  window.replyLengths = [];
  const watch = {subtree: true, childList: true, characterData: true};
  new MutationObserver(() => {
    const replies = document.querySelectorAll('.turn .reply');
    const last = replies[replies.length - 1];
    if (last && !last.parentElement.querySelector('.timing')) {
      window.replyLengths.push(last.textContent.length);
    }
  }).observe(document.getElementById('messages'), watch);
}
"""


async def test_sign_in_chat_stream_timing_reload(
    sqlite_url: str,
    make_client: MakeClient,
    engine: LocalVLLMEngine,
    browser: Browser,
    artifacts: Path,
) -> None:
    # A few characters every 80 ms, whatever vLLM merges: a slow reader gets the demo
    # model's short reply in two engine steps, too few for two partial states on screen.
    client = await make_client(sqlite_url, engine_override=TrickleEngine(engine, 3, 0.08))
    key = await issue_key(sqlite_url, "web-user")
    context = await browser.new_context(viewport={"width": 1000, "height": 800})
    page = await context.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))

    # Sign in through the fragment link `make run` prints; the fragment is dropped at once.
    await page.goto(base_url(client) + f"#key={key}")
    await expect(page.get_by_label("Message")).to_be_visible()
    assert "#" not in page.url and key not in page.url
    assert await page.evaluate("localStorage.getItem('bot.apiKey')") == key

    await page.evaluate(WATCH_REPLIES)
    await send(page, "Hello there!")
    turns = page.locator(".turn")
    await expect(turns.nth(0).locator(".timing-summary")).to_be_visible(timeout=20_000)
    lengths = await page.evaluate("window.replyLengths.filter((n) => n > 0)")
    # At least two partial states were on screen before the reply was complete. (vLLM merges
    # the steps a slow reader has not taken yet, so on a busy machine there may be few.)
    assert len(set(lengths)) >= 2, f"the reply did not stream: {lengths}"

    await send(page, "And how are you?")
    await expect(turns.nth(1).locator(".timing-summary")).to_be_visible(timeout=20_000)
    await expect(turns).to_have_count(2)

    replies = [await turns.nth(i).locator(".reply").inner_text() for i in range(2)]
    assert all(reply.strip() for reply in replies)
    # The timing is one line under the reply; a click opens where the time went.
    await turns.nth(1).locator(".timing-summary").click()
    await expect(turns.nth(1).locator(".timing-bar")).to_be_visible()
    # The bar is split by layer; prefill and decode come from vLLM's own timestamps.
    layers = (
        await turns.nth(1)
        .locator(".timing-bar .layer")
        .evaluate_all("(parts) => parts.map((part) => part.dataset.layer)")
    )
    assert {"prefill", "decode", "deliver"} <= set(layers)
    facts = await turns.nth(1).locator(".timing-facts").inner_text()
    assert re.search(r"TTFT \d", facts) and re.search(r"\d+ tok/s", facts)
    # Turn 2 re-reads turn 1 from the prefix cache and prefills only the rest.
    cached = re.search(r"prompt (\d+) tok: (\d+) from cache, (\d+) prefilled", facts)
    assert cached is not None, facts
    prompt, from_cache, prefilled = map(int, cached.groups())
    assert from_cache >= 32 and prefilled == prompt - from_cache and prefilled < prompt

    await page.screenshot(path=str(artifacts / "web-chat.png"), full_page=True)

    # Reload: the same conversation comes back, replies and timing lines included.
    await page.reload()
    await expect(turns).to_have_count(2)
    # Each reply is rendered once the page's Markdown module has loaded: wait for it.
    for index, reply in enumerate(replies):
        await expect(turns.nth(index).locator(".reply")).to_have_text(reply)
    await expect(turns.nth(1).locator(".timing-summary")).to_be_visible()

    # The key never travelled in a URL the server saw.
    assert requests and not any(key in url for url in requests)

    # A new conversation starts empty and remembers nothing of the old one.
    await page.get_by_role("button", name="New conversation").click()
    await expect(turns).to_have_count(0)
    await page.reload()
    await expect(page.get_by_label("Message")).to_be_visible()
    await expect(turns).to_have_count(0)

    # Phone-sized screen: nothing overflows sideways.
    await page.set_viewport_size(PHONE)
    await page.get_by_role("button", name="New conversation").click()
    await send(page, "Hi from a phone")
    await expect(turns.nth(0).locator(".timing-summary")).to_be_visible(timeout=20_000)
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await page.screenshot(path=str(artifacts / "web-chat-phone.png"), full_page=True)
    await context.close()


async def test_errors_are_shown_with_their_class_and_a_hint(
    sqlite_url: str, make_client: MakeClient, browser: Browser, artifacts: Path
) -> None:
    client = await make_client(sqlite_url, server={"max_text_chars": 100})
    key = await issue_key(sqlite_url)
    context = await browser.new_context()
    page = await context.new_page()

    # A wrong key: refused at sign-in, with the class and a hint.
    await page.goto(base_url(client))
    await page.get_by_label("API key").fill("bot_nope_wrong")
    await page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    await expect(alert).to_contain_text("auth")
    await expect(alert).to_contain_text("refused")
    await expect(alert).to_contain_text("botctl keys create")
    await expect(page.get_by_label("API key")).to_be_visible()
    await page.screenshot(path=str(artifacts / "web-bad-key.png"))

    # The right key; then a message over the limit.
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_label("Message")).to_be_visible()
    await expect(alert).to_be_hidden()
    await send(page, "x" * 150)
    failed = page.locator(".turn .bubble.bot.failed")
    await expect(failed).to_contain_text("bad_request")
    await expect(failed).to_contain_text("the limit is 100")
    await expect(failed).to_contain_text("Shorten")

    # The engine is down (same database and key; another app, so another origin). It
    # replaces the first app: one server per SQLite file, or both would run its turns.
    down = await make_client(sqlite_url, engine_override=DownEngine())
    await page.goto(base_url(down) + f"#key={key}")
    await send(page, "Anyone there?")
    await expect(failed.last).to_contain_text("engine_unavailable", timeout=10_000)
    await expect(failed.last).to_contain_text("try again")
    await page.screenshot(path=str(artifacts / "web-errors.png"), full_page=True)
    await context.close()
