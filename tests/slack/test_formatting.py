"""A reply as a Slack message (Markdown block + plain text), and cut into messages."""

from __future__ import annotations

import pytest

from bot.channels.slack.render import MARKDOWN_BLOCK_MAX_CHARS, plain_text, render_reply
from bot.channels.slack.splitting import first_cut, split


def test_short_text_is_one_message() -> None:
    assert first_cut("hello world", 100) is None
    assert split("hello world", 100) == ["hello world"]


def test_cuts_fall_on_paragraphs_then_words() -> None:
    text = ("word " * 30).strip() + "\n\n" + ("more " * 30).strip()
    pieces = split(text, 200)
    assert pieces[0].endswith("\n\n")
    assert "".join(pieces) == text
    assert all(len(p) <= 200 for p in pieces)
    words = split("abc " * 100, 100)
    assert all(p.endswith(" ") for p in words[:-1])
    assert "".join(words) == "abc " * 100


def test_a_cut_inside_code_closes_and_reopens_the_fence() -> None:
    text = "intro\n```\n" + "\n".join(f"line {i}" for i in range(60)) + "\n```\nafter"
    pieces = split(text, 150)
    assert len(pieces) > 2
    for piece in pieces:
        assert piece.count("```") % 2 == 0, piece
        assert len(piece) <= 150
    assert pieces[1].startswith("```\n")


def test_a_word_longer_than_the_window_is_cut_hard() -> None:
    pieces = split("x" * 250, 100)
    assert "".join(pieces) == "x" * 250
    assert all(len(p) <= 100 for p in pieces)


def test_streamed_characters_are_never_taken_back() -> None:
    text = "a" * 90 + " " + "b" * 30
    cut = first_cut(text, 100, min_index=95)
    assert cut is not None and cut.consumed >= 95


# -- the message sent by chat.postMessage / chat.update ------------------------------

MODEL_REPLY = """## Steps

1. Install with `pip install x`
2. Run **it**:

```bash
x --fast < in.txt
```

| a | b |
|---|---|
| 1 | 2 |

See [docs](https://example.com/a_(b)).
"""


def test_a_reply_goes_as_a_markdown_block_with_plain_text_beside_it() -> None:
    message = render_reply(MODEL_REPLY)
    # Standard Markdown, as written: Slack renders lists, code, tables and links itself.
    assert message.blocks == [{"type": "markdown", "text": MODEL_REPLY.strip()}]
    assert message.text == (
        "Steps\n\n"
        "1. Install with pip install x\n"
        "2. Run it:\n\n"
        "x --fast &lt; in.txt\n"
        "a | b\n"
        "1 | 2\n\n"
        "See docs (https://example.com/a_(b))."
    )


@pytest.mark.parametrize(
    ("markdown", "text"),
    [
        ("***both*** and ~~gone~~", "both and gone"),
        ("> quoted **x**", "quoted x"),
        ("- one\n- two\n  - nested", "• one\n• two\n  • nested"),
        ("~~~\ncode <b>\n~~~", "code <b>"),
        ("<!channel> & <b>raw</b>", "<!channel> & <b>raw</b>"),
        ("[https://a.b](https://a.b)", "https://a.b"),
        ("line one\nline two", "line one\nline two"),
    ],
)
def test_plain_text_drops_markup_and_keeps_meaning(markdown: str, text: str) -> None:
    assert plain_text(markdown) == text


def test_slack_markup_in_the_text_is_escaped() -> None:
    # Unescaped, <!channel> would notify everyone in the channel.
    assert (
        render_reply("hey <!channel> & <@U123>").text == "hey &lt;!channel&gt; &amp; &lt;@U123&gt;"
    )


def test_a_partial_reply_is_sent_as_typed_so_far() -> None:
    message = render_reply("Here is **half")
    assert message.blocks == [{"type": "markdown", "text": "Here is **half"}]
    assert message.text == "Here is **half"


def test_text_past_the_block_limit_goes_as_plain_text_alone() -> None:
    long = "word " * (MARKDOWN_BLOCK_MAX_CHARS // 5 + 1)
    message = render_reply(long)
    assert message.blocks is None and message.text == long.strip()
    assert render_reply("   ").blocks is None
