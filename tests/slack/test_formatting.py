"""Markdown -> mrkdwn, and cutting long replies into messages."""

from __future__ import annotations

import pytest

from bot.channels.slack.chunks import first_cut, split
from bot.channels.slack.mrkdwn import markdown_to_mrkdwn


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __bold__", "*bold* and *bold*"),
        ("*italic* and _italic_", "_italic_ and _italic_"),
        ("***both***", "*_both_*"),
        ("~~gone~~", "~gone~"),
        (
            "see [the docs](https://example.com/x?a=1&b=2)",
            "see <https://example.com/x?a=1&amp;b=2|the docs>",
        ),
        ("# Title\n## Sub **x**", "*Title*\n*Sub x*"),
        ("- one\n* two\n  + nested", "• one\n• two\n  • nested"),
        ("1 < 2 & 3 > 2", "1 &lt; 2 &amp; 3 &gt; 2"),
        ("> quoted **x**", "> quoted *x*"),
        ("use `a**b**<c>` here", "use `a**b**&lt;c&gt;` here"),
        ("```python\nif a < b:\n    **x**\n```", "```\nif a &lt; b:\n    **x**\n```"),
        ("2 * 3 * 4", "2 * 3 * 4"),
        ("snake_case_name", "snake_case_name"),
        ("---", "──────────"),
    ],
)
def test_markdown_to_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert markdown_to_mrkdwn(markdown) == mrkdwn


def test_a_fence_still_open_mid_stream_is_closed() -> None:
    assert markdown_to_mrkdwn("code:\n```\nx = 1") == "code:\n```\nx = 1\n```"


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
