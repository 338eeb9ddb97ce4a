"""Text the database can store: one rule, the same on SQLite and PostgreSQL.

PostgreSQL's ``text`` refuses U+0000 (``invalid byte sequence for encoding
"UTF8": 0x00``) and no UTF-8 column can hold a lone surrogate; SQLite would
store both. JSON lets any client send them, and byte-level models decode to
U+0000 now and then. So every text that reaches a column passes through
``storable``: each such character becomes U+FFFD, the character Unicode
reserves for "a character that could not be represented".

User text is made storable when it is accepted, before it is tokenized, so
the stored text and the stored token ids say the same thing. Generated text
is made storable as it streams; its token ids, stored beside it, stay the
exact truth the next prompt is built from.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with U+0000 and lone surrogates replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text)


def storable_or_none(text: str | None) -> str | None:
    return None if text is None else storable(text)


def is_storable(text: str) -> bool:
    """True when ``text`` holds neither U+0000 nor a lone surrogate."""
    return _UNSTORABLE.search(text) is None


def storable_json(value: Any) -> Any:
    """A JSON value with every string in it (keys too) made storable."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable_json(key): storable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(item) for item in value]
    return value
