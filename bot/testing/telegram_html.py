"""Telegram's HTML parse mode, as the fake Bot API checks it.

Follows the Bot API's "HTML style" rules: only the listed tags, properly
nested and closed; ``&lt; &gt; &amp; &quot;`` and numeric entities decoded
(any other ``&`` stays literal, as Telegram leaves it); errors worded and
placed (UTF-8 byte offsets) as Telegram words them. The result is the plain
text plus entities with UTF-16 offsets, which is what "message is not
modified" compares.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

_TAG_ENTITY = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
_ENTITY_REF = re.compile(r"&(#[0-9]{1,7}|#x[0-9a-fA-F]{1,6}|lt|gt|amp|quot);")
_TAG_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9-]*")
_ATTRIBUTE = re.compile(r"""\s*([a-zA-Z-]+)\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""")


class EntityParseError(ValueError):
    """Worded like Telegram's: the API answers ``Bad Request: can't parse entities: <this>``."""


@dataclass(frozen=True)
class Entity:
    type: str
    offset: int
    length: int
    extra: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"type": self.type, "offset": self.offset, "length": self.length, **dict(self.extra)}


@dataclass
class _Open:
    tag: str
    start: int
    byte_offset: int
    attributes: dict[str, str] = field(default_factory=dict)


def utf16_len(text: str) -> int:
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


def parse_html(source: str) -> tuple[str, list[Entity]]:
    """Plain text and entities of ``source``; raises ``EntityParseError`` like Telegram."""
    out: list[str] = []
    units = 0  # UTF-16 length of the text so far
    stack: list[_Open] = []
    entities: list[Entity] = []
    index = 0
    while index < len(source):
        char = source[index]
        if char == "<":
            byte_offset = len(source[:index].encode())
            close = source.find(">", index)
            if source.startswith("</", index):
                if close < 0:
                    raise EntityParseError(f"Unclosed end tag at byte offset {byte_offset}")
                name = source[index + 2 : close].strip().lower()
                if not stack:
                    raise EntityParseError(f"Unexpected end tag at byte offset {byte_offset}")
                top = stack.pop()
                if top.tag != name:
                    raise EntityParseError(
                        f'Unmatched end tag at byte offset {byte_offset}, expected "</{top.tag}>", '
                        f'found "</{name}>"'
                    )
                entity = _entity(top, units)
                if entity is not None:
                    entities.append(entity)
                index = close + 1
                continue
            name_match = _TAG_NAME.match(source, index + 1)
            name = name_match.group(0).lower() if name_match else ""
            if name not in _TAG_ENTITY:
                raise EntityParseError(
                    f'Unsupported start tag "{name}" at byte offset {byte_offset}'
                )
            if close < 0:
                raise EntityParseError(f"Unclosed start tag at byte offset {byte_offset}")
            assert name_match is not None
            attributes = {
                key.lower(): html.unescape(value.strip("\"'"))
                for key, value in _ATTRIBUTE.findall(source[name_match.end() : close])
            }
            stack.append(_Open(name, units, byte_offset, attributes))
            index = close + 1
            continue
        if char == "&":
            ref = _ENTITY_REF.match(source, index)
            if ref:
                decoded = html.unescape(ref.group(0))
                out.append(decoded)
                units += utf16_len(decoded)
                index = ref.end()
                continue
        out.append(char)
        units += utf16_len(char)
        index += 1
    if stack:
        raise EntityParseError(f'Can\'t find end tag corresponding to start tag "{stack[-1].tag}"')
    return _strip("".join(out), entities)


def _entity(opened: _Open, end: int) -> Entity | None:
    length = end - opened.start
    if length <= 0:
        return None  # Telegram drops empty entities
    kind = _TAG_ENTITY[opened.tag]
    extra: tuple[tuple[str, str], ...] = ()
    if opened.tag == "span" and opened.attributes.get("class") != "tg-spoiler":
        return None
    if kind == "text_link":
        url = opened.attributes.get("href", "")
        if not url:
            return None
        extra = (("url", url),)
    if kind == "code" and opened.attributes.get("class", "").startswith("language-"):
        extra = (("language", opened.attributes["class"].removeprefix("language-")),)
    if kind == "blockquote" and "expandable" in opened.attributes:
        kind = "expandable_blockquote"
    return Entity(kind, opened.start, length, extra)


def _strip(text: str, entities: list[Entity]) -> tuple[str, list[Entity]]:
    """Telegram trims leading and trailing whitespace off a message and clips entities to it."""
    stripped = text.strip()
    lead = utf16_len(text[: len(text) - len(text.lstrip())])
    size = utf16_len(stripped)
    clipped: list[Entity] = []
    for entity in sorted(entities, key=lambda e: (e.offset, -e.length)):
        start = max(0, entity.offset - lead)
        end = min(size, entity.offset + entity.length - lead)
        if end > start:
            clipped.append(Entity(entity.type, start, end - start, entity.extra))
    return stripped, clipped


def plain(text: str) -> tuple[str, list[Entity]]:
    """A message sent without parse_mode: the text, trimmed, and no entities."""
    return _strip(text, [])
