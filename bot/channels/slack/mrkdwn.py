"""The model's Markdown -> Slack's mrkdwn, for ``text`` of chat.postMessage / chat.update.

Streams need none of this: chat.startStream/appendStream take Markdown as is.
Only what differs is rewritten:

==================  ==================
Markdown            mrkdwn
==================  ==================
``**b**`` ``__b__``  ``*b*``
``*i*``              ``_i_``
``~~s~~``            ``~s~``
``[t](url)``         ``<url|t>``
``# Heading``        ``*Heading*``
``- item``           ``• item``
`````python``        ````` (no language tags)
==================  ==================

``&``, ``<`` and ``>`` are escaped everywhere (Slack reads ``<...>`` as a
reference) except a leading ``>`` that quotes a line. A fence left open by a
reply still being generated is closed, so half a code block renders as code.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_QUOTE = re.compile(r"^\s{0,3}>\s?(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[([^\]\n]+)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_BOLD_ITALIC = re.compile(r"\*\*\*(?=\S)(.+?)(?<=\S)\*\*\*")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_ITALIC_STAR = re.compile(r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")

# Private-use characters stand in for finished markup while later rules run,
# so ``**b**`` -> ``*b*`` is never read again as ``*i*``.
_BOLD_MARK = "\ue000"
_LINK_MARK = "\ue001"


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _inline(text: str) -> str:
    links: list[str] = []

    def keep_link(match: re.Match[str]) -> str:
        label, url = match.group(1), match.group(2)
        links.append(f"<{escape(url)}|{escape(label).replace('|', '¦')}>")
        return f"{_LINK_MARK}{len(links) - 1}{_LINK_MARK}"

    text = _LINK.sub(keep_link, text)
    text = escape(text)
    text = _BOLD_ITALIC.sub(lambda m: f"{_BOLD_MARK}_{m.group(1)}_{_BOLD_MARK}", text)
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{m.group(2)}{_BOLD_MARK}", text)
    text = _ITALIC_STAR.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text)
    text = text.replace(_BOLD_MARK, "*")
    return re.sub(f"{_LINK_MARK}(\\d+){_LINK_MARK}", lambda m: links[int(m.group(1))], text)


def _line(line: str) -> str:
    # Inline code is literal: escaped, never restyled.
    parts: list[str] = []
    pos = 0
    for match in _INLINE_CODE.finditer(line):
        parts.append(_inline(line[pos : match.start()]))
        parts.append(f"`{escape(match.group(2))}`")
        pos = match.end()
    parts.append(_inline(line[pos:]))
    return "".join(parts)


def _block_line(line: str) -> str:
    if _RULE.match(line):
        return "──────────"
    heading = _HEADING.match(line)
    if heading:
        # The whole heading is bold already; bold inside it would toggle it off.
        inner = _line(_BOLD.sub(r"\2", heading.group(1))).strip("*")
        return f"*{inner}*" if inner else ""
    quote = _QUOTE.match(line)
    if quote:
        return f"> {_block_line(quote.group(1))}".rstrip()
    bullet = _BULLET.match(line)
    if bullet:
        return f"{bullet.group(1)}• {_line(bullet.group(2))}"
    return _line(line)


def markdown_to_mrkdwn(text: str) -> str:
    out: list[str] = []
    in_fence = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
            out.append("```")
        elif in_fence:
            out.append(escape(line))
        else:
            out.append(_block_line(line))
    if in_fence:
        out.append("```")
    return "\n".join(out)
