"""An OpenAI message list, reduced to what a token-exact conversation is made of.

A conversation here is a run of exchanges: the user's text, then the reply.
OpenAI clients send a flat list of role-tagged messages instead, re-sent in
full on every call. This module folds that list into

* ``exchanges``: every (user text, assistant reply) pair that is already
  answered, oldest first, and
* ``pending``: the text of the new user turn (everything after the last
  assistant message),

and hashes exchanges, so that a request can be matched against the turns
already stored. System and developer messages have no place of their own in
the stored history (the service's ``chat.system_prompt`` opens every
conversation): they are folded into the user turn they precede, and so reach
the model as text of that turn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
USER_SIDE_ROLES = frozenset({"system", "developer", "user"})
ASSISTANT_ROLE = "assistant"
PART_SEPARATOR = "\n\n"
"""Between the messages folded into one user turn (a system message and the user's text)."""


class MessagesError(ValueError):
    """The messages cannot be answered: the reason is for the client (400)."""


@dataclass(frozen=True)
class Exchange:
    user: str
    assistant: str


@dataclass(frozen=True)
class Folded:
    exchanges: tuple[Exchange, ...]
    pending: str


def content_text(content: Any, where: str) -> str:
    """The text of a message's ``content``: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in TEXT_PART_TYPES:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MessagesError(f"{where}: only text content is supported, not {kind!r}")
            text = part.get("text")
            if not isinstance(text, str):
                raise MessagesError(f"{where}: a text part needs a string 'text'")
            texts.append(text)
        return "".join(texts)
    raise MessagesError(f"{where}: content must be a string or a list of text parts")


def fold(messages: Sequence[dict[str, Any]], where: str = "messages") -> Folded:
    """Exchanges and the pending user turn of a chat-completions message list."""
    exchanges: list[Exchange] = []
    user_side: list[str] = []
    for index, message in enumerate(messages):
        at = f"{where}[{index}]"
        role = message.get("role")
        if message.get("tool_calls") or role in {"tool", "function"}:
            raise MessagesError(f"{at}: tool calls are not supported")
        if role == ASSISTANT_ROLE:
            exchanges.append(Exchange(join(user_side), content_text(message.get("content"), at)))
            user_side = []
        elif role in USER_SIDE_ROLES:
            user_side.append(content_text(message.get("content"), at))
        else:
            raise MessagesError(f"{at}: unknown role {role!r}")
    if not user_side or not join(user_side):
        raise MessagesError(f"{where}: the last message must be a non-empty user message")
    return Folded(tuple(exchanges), join(user_side))


def join(parts: Iterable[str]) -> str:
    return PART_SEPARATOR.join(part for part in parts if part)


def same_text(a: str, b: str) -> bool:
    """Client round trips may trim a reply's surrounding whitespace; nothing else may change."""
    return a.strip() == b.strip()


EMPTY_CONTEXT = hashlib.sha256(b"").hexdigest()
"""The hash of a conversation with no exchange yet."""


def extend_hash(previous: str, exchange: Exchange) -> str:
    """The hash of a conversation state one exchange further.

    Chained, so a state reached through ``previous_response_id`` (where the
    client never sends the text) gets the same hash as the same exchanges sent
    in full to ``/v1/chat/completions``. Whitespace is trimmed as ``same_text``.
    """
    piece = json.dumps(
        [exchange.user.strip(), exchange.assistant.strip()],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(f"{previous}{piece}".encode()).hexdigest()


def context_hash(exchanges: Sequence[Exchange]) -> str:
    """Names a conversation state: the exchanges so far, oldest first."""
    value = EMPTY_CONTEXT
    for exchange in exchanges:
        value = extend_hash(value, exchange)
    return value
