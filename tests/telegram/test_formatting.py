"""Markdown -> Telegram HTML: valid for Telegram's parser on every prefix, never longer visibly."""

from __future__ import annotations

import pytest

from bot.channels.telegram.formatting import markdown_to_html, open_fence_after, visible_text
from tests.fakes.telegram_html import parse_html

SAMPLE = """# Plan

Use **bold**, *italic*, _also italic_, ~~gone~~ and `inline <code>` here.
- first & foremost
* second with a [link](https://example.com/a?b=1&c=2)

```python
if a < b and c > d:
    print("x & y")
```
Numbers like 2*3*4 and snake_case_names stay as they are.
"""


def test_converts_the_common_constructs() -> None:
    html = markdown_to_html(SAMPLE)
    assert "<b>Plan</b>" in html
    assert "<b>bold</b>" in html and "<i>italic</i>" in html and "<i>also italic</i>" in html
    assert "<s>gone</s>" in html
    assert "<code>inline &lt;code&gt;</code>" in html
    assert "• first &amp; foremost" in html
    assert '<a href="https://example.com/a?b=1&amp;c=2">link</a>' in html
    assert '<pre><code class="language-python">if a &lt; b and c &gt; d:' in html
    assert "2*3*4" in html and "snake_case_names" in html


def test_telegram_accepts_it_and_sees_the_intended_text() -> None:
    text, entities = parse_html(markdown_to_html(SAMPLE))
    kinds = {entity.type for entity in entities}
    assert {"bold", "italic", "strikethrough", "code", "text_link", "pre"} <= kinds
    assert 'print("x & y")' in text
    assert "**" not in text and "```" not in text


def test_every_prefix_is_valid_and_never_visibly_longer_than_its_source() -> None:
    for end in range(len(SAMPLE) + 1):
        prefix = SAMPLE[:end]
        html = markdown_to_html(prefix)
        parse_html(html)  # raises like Telegram on invalid entities
        assert len(visible_text(html)) <= len(prefix)


def test_unclosed_markers_stay_literal() -> None:
    assert markdown_to_html("**not yet") == "**not yet"
    assert markdown_to_html("a `b") == "a `b"


def test_a_code_block_continues_in_the_next_chunk() -> None:
    first = "text\n```py\nx = 1\n"
    assert open_fence_after(first) == "py"
    assert open_fence_after(first + "y = 2\n```\n") is None
    continued = markdown_to_html("y = 2 < 3\n```\nafter", open_fence="py")
    assert continued.startswith('<pre><code class="language-py">y = 2 &lt; 3</code></pre>')
    assert continued.endswith("after")


@pytest.mark.parametrize("raw", ["<script>", "a & b", "x > y", '"quoted"'])
def test_plain_characters_are_escaped(raw: str) -> None:
    text, entities = parse_html(markdown_to_html(raw))
    assert text == raw and entities == []
