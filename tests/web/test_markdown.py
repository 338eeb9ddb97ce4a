"""Replies rendered as Markdown in real headless Chromium: formatted, and never executable.

The page's own files are served by a real aiohttp server on loopback; the
renderer module (marked + DOMPurify, vendored) runs in the browser as the page
runs it, on what a chat model writes and on what an attacker would make it write.
"""

from __future__ import annotations

import pytest
from playwright.async_api import Page

pytestmark = pytest.mark.browser

MODEL_REPLY = """## Steps

1. Install with `pip install x`
2. Run it **fast** and *carefully*, ***both*** or ~~never~~:

```python
if a < b:
    print("x & y")
```

> Quoted advice.

| Animal | Legs |
|---|---|
| cat | 4 |

See [the docs](https://en.wikipedia.org/wiki/Foo_(bar)).
line one
line two
"""

ATTACKS = [
    '<img src=x onerror="window.pwned = 1">',
    "<script>window.pwned = 1</script>",
    '<a href="javascript:window.pwned = 1">click</a>',
    "[click](javascript:window.pwned=1)",
    '<iframe src="data:text/html,<script>parent.pwned=1</script>"></iframe>',
    "![x](javascript:window.pwned=1)",
    '<div onmouseover="window.pwned=1">hover</div>',
]

RENDER = """
async (text) => {
  const { renderMarkdown } = await import('/static/markdown.js');
  const box = document.createElement('div');
  box.className = 'reply';
  box.replaceChildren(renderMarkdown(text));
  document.body.append(box);
  return box.innerHTML;
}
"""


async def test_a_model_reply_is_formatted(page: Page) -> None:
    html = await page.evaluate(RENDER, MODEL_REPLY)
    assert "<h2>Steps</h2>" in html
    assert "<ol>" in html and "<code>pip install x</code>" in html
    assert "<strong>fast</strong>" in html and "<em>carefully</em>" in html
    assert "<em><strong>both</strong></em>" in html and "<del>never</del>" in html
    assert '<pre><code class="language-python">if a &lt; b:\n    print("x &amp; y")' in html
    assert "<blockquote>" in html and "<table>" in html and "<td>cat</td>" in html
    assert (
        '<a href="https://en.wikipedia.org/wiki/Foo_(bar)" target="_blank" '
        'rel="noopener noreferrer">the docs</a>'
    ) in html
    assert "line one<br>line two" in html
    # Code is monospaced by the page's style sheet.
    font = await page.evaluate(
        "getComputedStyle(document.querySelector('.reply pre code')).fontFamily"
    )
    assert "monospace" in font


@pytest.mark.parametrize("attack", ATTACKS)
async def test_raw_html_and_script_urls_stay_inert(page: Page, attack: str) -> None:
    html = await page.evaluate(RENDER, f"Here: {attack} done")
    await page.mouse.move(10, 10)
    await page.locator(".reply").hover()
    found = await page.evaluate(
        "document.querySelectorAll('.reply img, .reply script, .reply iframe, .reply div').length"
    )
    assert found == 0, html
    assert "javascript:" not in await page.evaluate(
        "[...document.querySelectorAll('.reply a')].map((a) => a.href).join(' ')"
    )
    for link in await page.locator(".reply a").all():
        await link.click(modifiers=["Control"])  # would run a javascript: URL if one survived
    assert await page.evaluate("window.pwned") is None, html


async def test_every_streamed_prefix_renders(page: Page) -> None:
    # The page re-renders the whole reply on each delta: unclosed **bold** or ``` fences
    # must render as typed so far, never throw.
    prefixes = [MODEL_REPLY[:end] for end in range(0, len(MODEL_REPLY) + 1, 3)]
    rendered = await page.evaluate(
        """async (prefixes) => {
          const { renderMarkdown } = await import('/static/markdown.js');
          return prefixes.map((text) => {
            const box = document.createElement('div');
            box.replaceChildren(renderMarkdown(text));
            return box.textContent;
          });
        }""",
        prefixes,
    )
    assert len(rendered) == len(prefixes)
    half_bold = await page.evaluate(RENDER, "Run it **fa")
    assert "**fa" in half_bold and "<strong>" not in half_bold
    open_fence = await page.evaluate(RENDER, "```python\nx = 1")
    assert '<pre><code class="language-python">x = 1' in open_fence
