"""An OpenAI message list, reduced to what a token-exact conversation is made of.

A conversation here is a run of exchanges: the user's text, then the reply.
OpenAI clients send a flat list of role-tagged messages instead, re-sent in
full on every call. This module folds that list into

* ``exchanges``: every (user text, assistant reply) pair that is already
  answered, oldest first (``bot.turns.carried.Exchange``), and
* ``pending``: the text of the new user turn (everything after the last
  assistant message).

System and developer messages have no place of their own in the stored
history (the service's ``chat.system_prompt`` opens every conversation): they
are folded into the user turn they precede, and so reach the model as text of
that turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bot.channels.openai.errors import bad_request
from bot.channels.openai.requests import (
    TEXT_PART_TYPES,
    ChatMessage,
    Content,
    InputMessage,
)
from bot.turns.carried import Exchange

ASSISTANT_ROLE = "assistant"
PART_SEPARATOR = "\n\n"
"""Between the messages folded into one user turn (a system message and the user's text)."""


class MessagesError(ValueError):
    """The messages cannot be answered: the reason is for the client (400)."""


@dataclass(frozen=True)
class Folded:
    exchanges: tuple[Exchange, ...]
    pending: str


def content_text(content: Content | None, where: str) -> str:
    """The text of a message's ``content``: a string, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        if part.type not in TEXT_PART_TYPES:
            raise MessagesError(f"{where}.content[{index}]: only text content is supported")
        if part.text is None:
            raise MessagesError(f"{where}.content[{index}]: a text part needs a string 'text'")
        texts.append(part.text)
    return "".join(texts)


def fold(messages: Sequence[ChatMessage | InputMessage], where: str = "messages") -> Folded:
    """Exchanges and the pending user turn of a message list."""
    exchanges: list[Exchange] = []
    user_side: list[str] = []
    for index, message in enumerate(messages):
        at = f"{where}[{index}]"
        if isinstance(message, ChatMessage) and (
            message.tool_calls or message.function_call or message.role in {"tool", "function"}
        ):
            raise MessagesError(f"{at}: tool calls are not supported")
        text = content_text(message.content, at)
        if message.role == ASSISTANT_ROLE:
            exchanges.append(Exchange(join(user_side), text))
            user_side = []
        else:
            user_side.append(text)
    if not user_side or not join(user_side):
        raise MessagesError(f"{where}: the last message must be a non-empty user message")
    return Folded(tuple(exchanges), join(user_side))


def join(parts: Iterable[str]) -> str:
    return PART_SEPARATOR.join(part for part in parts if part)


def fold_messages(messages: Sequence[ChatMessage | InputMessage], where: str) -> Folded:
    """``fold``; a list it cannot fold is a 400 naming ``where``."""
    try:
        return fold(messages, where)
    except MessagesError as exc:
        raise bad_request(str(exc), where) from None
