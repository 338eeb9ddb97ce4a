"""Message splitting: Telegram-sized chunks, sensible boundaries, stable while a reply grows."""

from __future__ import annotations

import pytest

from bot.channels.telegram.splitting import MAX_MESSAGE_CHARS, split_message, utf16_len

PARAGRAPH = "This is a sentence of a long answer. " * 5 + "\n\n"


def test_short_text_is_one_chunk() -> None:
    assert split_message("hello") == ["hello"]
    assert split_message("") == [""]


def test_long_text_splits_at_paragraphs_within_the_limit() -> None:
    text = PARAGRAPH * 60  # about 11 000 characters
    chunks = split_message(text)
    assert len(chunks) == 3
    assert "".join(chunks) == text
    assert all(utf16_len(chunk) <= MAX_MESSAGE_CHARS for chunk in chunks)
    assert all(chunk.endswith("\n\n") for chunk in chunks[:-1])


def test_falls_back_to_lines_sentences_words_then_a_hard_cut() -> None:
    lines = "a line of text\n" * 10
    assert split_message(lines, 40)[0].endswith("\n")
    sentences = "One. Two is longer. Three! " * 4
    assert split_message(sentences, 40)[0].endswith(("! ", ". "))
    words = "word " * 30
    assert split_message(words, 23)[0] == "word " * 4
    solid = "x" * 100
    assert split_message(solid, 40) == ["x" * 40, "x" * 40, "x" * 20]


def test_a_boundary_in_the_first_half_is_not_taken() -> None:
    # A paragraph break at 10 of 100 would waste most of the message: cut at a word instead.
    text = "intro\n\n" + "word " * 40
    first = split_message(text, 100)[0]
    assert len(first) > 50 and first.endswith(" ")


def test_counts_utf16_units_so_emoji_heavy_text_fits() -> None:
    text = "😀" * 3000  # 6000 UTF-16 units, 3000 code points
    chunks = split_message(text)
    assert len(chunks) == 2
    assert all(utf16_len(chunk) <= MAX_MESSAGE_CHARS for chunk in chunks)
    assert "".join(chunks) == text


@pytest.mark.parametrize("step", [1, 7, 113])
def test_completed_chunks_never_change_as_the_reply_grows(step: int) -> None:
    text = (PARAGRAPH + "A line\n" + "word " * 50) * 6
    limit = 300
    final = split_message(text, limit)
    for end in range(0, len(text), step):
        chunks = split_message(text[:end], limit)
        # Every chunk but the last is already the final one.
        assert chunks[:-1] == final[: len(chunks) - 1]


def test_limit_must_allow_progress() -> None:
    with pytest.raises(ValueError):
        split_message("abc", 1)
