"""Markdown -> Telegram HTML: CommonMark's meaning, valid for Telegram's parser on every prefix."""

from __future__ import annotations

import pytest

from bot.channels.telegram.formatting import markdown_to_html, open_fence_after, visible_text
from bot.channels.telegram.render import Renderer
from bot.testing.telegram_html import parse_html

# What a small chat model writes: headings, emphasis, lists, code, a link, a quote, a table.
SAMPLE = """# Plan

Use **bold**, *italic*, _also italic_, ~~gone~~ and `inline <code>` here.
- first & foremost
* second with a [link](https://example.com/a?b=1&c=2)

```python
if a < b and c > d:
    print("x & y")
```
Numbers like 2 * 3 * 4 and snake_case_names stay as they are.
"""

TABLE = """| Animal | Legs |
|---|---|
| cat | 4 |
| bird | 2 |
"""


def entities_of(markdown: str) -> tuple[str, set[str]]:
    text, entities = parse_html(markdown_to_html(markdown))
    return text, {entity.type for entity in entities}


def test_converts_the_common_constructs() -> None:
    html = markdown_to_html(SAMPLE)
    assert "<b>Plan</b>" in html
    assert "<b>bold</b>" in html and "<i>italic</i>" in html and "<i>also italic</i>" in html
    assert "<s>gone</s>" in html
    assert "<code>inline &lt;code&gt;</code>" in html
    assert "• first &amp; foremost" in html
    assert '<a href="https://example.com/a?b=1&amp;c=2">link</a>' in html
    assert '<pre><code class="language-python">if a &lt; b and c &gt; d:' in html
    assert "2 * 3 * 4" in html and "snake_case_names" in html


def test_telegram_accepts_it_and_sees_the_intended_text() -> None:
    text, entities = parse_html(markdown_to_html(SAMPLE))
    kinds = {entity.type for entity in entities}
    assert {"bold", "italic", "strikethrough", "code", "text_link", "pre"} <= kinds
    assert 'print("x & y")' in text
    assert "**" not in text and "```" not in text


def test_bold_italic_together_nests_properly() -> None:
    # A regex converter produced <b>*both</b>* here.
    assert markdown_to_html("***both***") == "<i><b>both</b></i>"
    text, kinds = entities_of("***both*** and **bold *inner***")
    assert text == "both and bold inner"
    assert {"bold", "italic"} <= kinds


def test_quotes_become_blockquotes() -> None:
    text, kinds = entities_of("Said:\n\n> stay **calm**\n> and carry on")
    assert text == "Said:\n\nstay calm\nand carry on"
    assert {"blockquote", "bold"} <= kinds


def test_tilde_fences_are_code_blocks() -> None:
    html = markdown_to_html("~~~js\nlet a = 1 < 2;\n~~~\ndone")
    assert html == '<pre><code class="language-js">let a = 1 &lt; 2;</code></pre>\ndone'


def test_urls_with_parentheses_keep_them() -> None:
    html = markdown_to_html("see [Foo](https://en.wikipedia.org/wiki/Foo_(bar)) now")
    assert '<a href="https://en.wikipedia.org/wiki/Foo_(bar)">Foo</a> now' in html


def test_tables_become_aligned_monospace() -> None:
    text, kinds = entities_of(TABLE)
    assert kinds == {"pre"}
    assert text.splitlines() == ["Animal | Legs", "-------+-----", "cat    | 4", "bird   | 2"]


def test_ordered_and_nested_lists() -> None:
    text, _ = entities_of("3. three\n4. four\n   - sub **item**\n")
    assert text == "3. three\n4. four\n  • sub item"


def test_unsafe_links_and_raw_html_are_text() -> None:
    text, kinds = entities_of('[click](javascript:alert(1)) <b onclick="x">hi</b>')
    assert "text_link" not in kinds and "bold" not in kinds
    assert '<b onclick="x">hi</b>' in text


def test_every_prefix_is_valid_while_streaming() -> None:
    for end in range(len(SAMPLE + TABLE) + 1):
        prefix = (SAMPLE + TABLE)[:end]
        parse_html(markdown_to_html(prefix))  # raises like Telegram on invalid entities


def test_prose_is_never_visibly_longer_than_its_source() -> None:
    for end in range(len(SAMPLE) + 1):
        prefix = SAMPLE[:end]
        assert len(visible_text(markdown_to_html(prefix))) <= len(prefix), prefix


def test_unclosed_markers_stay_literal() -> None:
    assert markdown_to_html("**not yet") == "**not yet"
    assert markdown_to_html("a `b") == "a `b"
    assert markdown_to_html("[half](https://exa") == "[half](https://exa"


def test_an_unclosed_fence_is_code_so_far() -> None:
    assert markdown_to_html("```py\nx = 1") == '<pre><code class="language-py">x = 1</code></pre>'


def test_a_code_block_continues_in_the_next_chunk() -> None:
    first = "text\n```py\nx = 1\n"
    assert open_fence_after(first) == "```py"
    assert open_fence_after(first + "y = 2\n```\n") is None
    assert open_fence_after("~~~\n```\n") == "~~~"  # only a tilde fence closes a tilde fence
    assert open_fence_after("````\n```\n") == "````"  # ... at least as long
    continued = markdown_to_html("y = 2 < 3\n```\nafter", open_fence="```py")
    assert continued.startswith('<pre><code class="language-py">y = 2 &lt; 3</code></pre>')
    assert continued.endswith("after")


def test_a_rendering_longer_than_a_message_goes_as_typed() -> None:
    rows = "\n".join(f"|{i}|x|" for i in range(12))
    table = f"|a|b|\n|-|-|\n{rows}\n"
    renderer = Renderer(limit=len(table))
    rendered = renderer.render([table], 0)
    assert rendered is not None and rendered.parse_mode is None
    assert rendered.text == table.strip()


@pytest.mark.parametrize("raw", ["<script>", "a & b", "x > y", '"quoted"'])
def test_plain_characters_are_escaped(raw: str) -> None:
    text, entities = parse_html(markdown_to_html(raw))
    assert text == raw and entities == []
