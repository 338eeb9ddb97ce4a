"""The model's Markdown as Discord draws it.

Discord renders most of Markdown itself (bold, italics, strikethrough,
headings ``#`` to ``###``, lists, quotes, masked links, inline code and
fenced code blocks with a language), so the reply goes out almost as written.
This module only changes what would come out wrong:

- code (fenced and inline) is never touched, and a fence left open by a
  reply still streaming is closed, so the preview renders as code too;
- a Markdown table, which Discord shows as a jumble of pipes, goes in a code
  block, where its columns line up;
- headings ``####`` and deeper, which Discord shows with their hashes, become
  a bold line; an image (Discord draws none from Markdown) becomes its link;
- ``<@id>``, ``<#id>``, ``<@&id>``, ``<t:...>`` and custom emoji, which Discord
  would draw as mentions and pills, are escaped so they read as written.

Nobody is ever pinged by a reply whatever it says: every message goes out with
``allowed_mentions`` parsing nothing (``deliveries.py``).
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_DEEP_HEADING = re.compile(r"^ {0,3}#{4,6}\s+(.*?)\s*#*\s*$")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_PILL = re.compile(r"<(?=[@#]|t:|a?:\w+:)")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?\s*$")
CLOSE_FENCE = "\n```"


def _is_table_row(line: str) -> bool:
    stripped = line.strip()
    return stripped.startswith("|") and stripped.count("|") >= 2


def _outside_code(line: str) -> str:
    """Escape what Discord would misdraw in text, leaving inline code spans alone."""
    parts = line.split("`")
    for index in range(0, len(parts), 2):  # even pieces lie outside backticks
        text = _IMAGE.sub(lambda m: f"[{m.group(1) or 'image'}]({m.group(2)})", parts[index])
        parts[index] = _PILL.sub(r"\\<", text)
    if len(parts) % 2 == 0:
        # An unpaired backtick opens no span: the text after it was left alone above.
        tail = parts[-1]
        parts[-1] = _PILL.sub(r"\\<", tail)
    return "`".join(parts)


def render(markdown: str) -> str:
    """``markdown`` as Discord message content (length may grow by a few characters)."""
    lines = markdown.split("\n")
    out: list[str] = []
    fence: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        opened = _FENCE.match(line)
        if fence is not None:
            out.append(line)
            if opened and opened.group(1) == fence:
                fence = None
            index += 1
            continue
        if opened:
            fence = opened.group(1)
            out.append(line)
            index += 1
            continue
        if (
            _is_table_row(line)
            and index + 1 < len(lines)
            and _TABLE_SEPARATOR.match(lines[index + 1])
        ):
            end = index + 2
            while end < len(lines) and _is_table_row(lines[end]):
                end += 1
            out.append("```")
            out.extend(lines[index:end])
            out.append("```")
            index = end
            continue
        heading = _DEEP_HEADING.match(line)
        if heading:
            line = f"**{heading.group(1)}**" if heading.group(1) else ""
        out.append(_outside_code(line))
        index += 1
    text = "\n".join(out)
    if fence is not None:
        text += CLOSE_FENCE  # a reply still streaming inside a code block
    return text
