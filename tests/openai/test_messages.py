"""Folding an OpenAI message list into exchanges and the new turn, and hashing exchanges."""

from __future__ import annotations

import pytest

from bot.channels.openai.messages import (
    Exchange,
    MessagesError,
    context_hash,
    extend_hash,
    fold,
)


def test_system_messages_fold_into_the_turn_they_precede() -> None:
    folded = fold(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "developer", "content": "Now in French."},
            {"role": "user", "content": [{"type": "text", "text": "Bye"}]},
        ]
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


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        [{"role": "user", "content": ""}],
        [{"role": "tool", "content": "42", "tool_call_id": "x"}],
        [{"role": "narrator", "content": "Hi"}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
        [{"role": "user", "content": 42}],
    ],
)
def test_unanswerable_lists_are_refused(messages: list[dict[str, object]]) -> None:
    with pytest.raises(MessagesError):
        fold(messages)
