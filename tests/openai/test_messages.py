"""Folding an OpenAI message list into exchanges and the new turn, and hashing exchanges."""

from __future__ import annotations

from typing import Any

import pytest

from bot.channels.openai.messages import MessagesError, fold
from bot.channels.openai.requests import ChatMessage
from bot.turns.carried import Exchange, context_hash, extend_hash, head_key


def typed(messages: list[dict[str, Any]]) -> list[ChatMessage]:
    return [ChatMessage.model_validate(message) for message in messages]


def test_system_messages_fold_into_the_turn_they_precede() -> None:
    folded = fold(
        typed(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "developer", "content": "Now in French."},
                {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
            ]
        )
    )
    assert folded.exchanges == (Exchange("Be brief.\n\nHi", "Hello"),)
    assert folded.pending == "Now in French.\n\nBye"


def test_chained_hash_equals_hash_of_the_whole_list() -> None:
    exchanges = [Exchange("a", "b"), Exchange("c", "d")]
    assert context_hash(exchanges) == extend_hash(context_hash(exchanges[:1]), exchanges[1])
    assert context_hash(exchanges) != context_hash(list(reversed(exchanges)))
    # A client that trims a reply's whitespace still names the same state.
    assert context_hash([Exchange("a", " b\n")]) == context_hash([Exchange("a", "b")])
    # Where one message ends and the next begins is part of the state.
    assert context_hash([Exchange("ab", "c")]) != context_hash([Exchange("a", "bc")])


def test_the_end_user_is_part_of_what_a_turn_answers() -> None:
    context = context_hash([Exchange("a", "b")])
    assert head_key(None, context, "c") == head_key("", context, "c")
    assert head_key("alice", context, "c") != head_key("bob", context, "c")
    assert head_key("alice", context, "c") != head_key(None, context, "c")


def test_unstorable_text_is_made_storable_before_it_is_hashed() -> None:
    # A lone surrogate cannot be encoded to hash (nor stored): it becomes U+FFFD.
    assert Exchange("a\ud800", "b\x00") == Exchange("a\ufffd", "b\ufffd")
    assert context_hash([Exchange("a\ud800", "b")])


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        [{"role": "user", "content": ""}],
        [{"role": "tool", "content": "42", "tool_call_id": "x"}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
        [{"role": "user", "content": [{"type": "text"}]}],
    ],
)
def test_unanswerable_lists_are_refused(messages: list[dict[str, Any]]) -> None:
    with pytest.raises(MessagesError):
        fold(typed(messages))
