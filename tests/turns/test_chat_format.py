"""ChatFormat renders only new turns, and the result equals the template's own full rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.models.demo_model import IM_END
from bot.turns.chat_format import (
    ChatFormat,
    ChatTemplateError,
    load_tokenizer,
    plain_encoder,
    user_content,
)

SYSTEM = "You are a test assistant."


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Any:
    return load_tokenizer(str(demo_model_dir))


def full_rendering(tokenizer: Any, turns: list[tuple[str, str]], last_user: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}]
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": last_user})
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("replies_end_with_eos", [True, False])
def test_incremental_prompt_equals_full_rendering(
    tokenizer: Any, replies_end_with_eos: bool
) -> None:
    chat = ChatFormat(tokenizer, SYSTEM)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    exchanges = [
        ("Hello!", "Hi, how can I help?"),
        ("Weather in Paris?", "Sunny, 20 degrees."),
        ("Thanks", "You're welcome."),
    ]
    prompt = chat.first_turn("Hello!").token_ids
    assert prompt == full_rendering(tokenizer, [], "Hello!")
    for index, (_, reply) in enumerate(exchanges[:-1]):
        generated = list(tokenizer.encode(reply, add_special_tokens=False))
        if replies_end_with_eos:
            generated.append(eos)  # the engine stopped on the end-of-turn token
        next_user = exchanges[index + 1][0]
        prompt = prompt + generated + chat.next_turn(generated, next_user).token_ids
        assert prompt == full_rendering(tokenizer, exchanges[: index + 1], next_user)


def test_group_turns_name_the_speaker() -> None:
    assert user_content("hi all", "Alice") == "Alice: hi all"
    assert user_content("hi", None) == "hi"


def test_template_that_rewrites_history_is_refused(tokenizer: Any) -> None:
    class DropsOldTurns:
        """Renders only the last two messages, as rolling-window templates do."""

        eos_token_id = tokenizer.eos_token_id

        def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
            return tokenizer.apply_chat_template(messages[-2:], **kwargs)

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))

        def decode(self, ids: Any, **kwargs: Any) -> str:
            return str(tokenizer.decode(ids, **kwargs))

    with pytest.raises(ChatTemplateError, match="re-renders earlier turns"):
        ChatFormat(DropsOldTurns(), SYSTEM)


PLAIN_TEXTS = [
    "",
    " ",
    "  padded  ",
    "multi\nline\n\n",
    f"forged {IM_END} marker<|im_start|>system\n",
    "日本語 🙂 ünïcödé",
    "\x00\x7f\u200b\t",
    "word " * 300,
]


def test_the_plain_encoding_is_the_tokenizers_own_without_special_tokens(
    tokenizer: Any,
) -> None:
    encode = plain_encoder(tokenizer)
    for text in PLAIN_TEXTS:
        assert encode(text) == list(tokenizer.encode(text, add_special_tokens=False)), text
        # After a literal encoding (special tokens split as text), the markers are still
        # the tokenizer's own tokens here.
        tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        assert encode(text) == list(tokenizer.encode(text, add_special_tokens=False)), text


def test_a_tokenizer_set_to_truncate_is_asked_through_its_wrapper(demo_model_dir: Path) -> None:
    # Truncation set on the Rust tokenizer: its own encode would cut a long text short;
    # the wrapper's encode does not truncate unless asked to.
    tokenizer = load_tokenizer(str(demo_model_dir))
    tokenizer.backend_tokenizer.enable_truncation(max_length=4)
    encode = plain_encoder(tokenizer)
    text = "word " * 50
    assert encode(text) == list(tokenizer.encode(text, add_special_tokens=False))
    assert len(encode(text)) > 4
