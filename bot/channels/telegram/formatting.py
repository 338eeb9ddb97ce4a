"""The model's Markdown, converted to the HTML subset Telegram accepts.

HTML rather than MarkdownV2: every character outside a tag only needs
``&``, ``<`` and ``>`` escaped, where MarkdownV2 needs eighteen characters
escaped and rejects a message for any one missed.

The conversion is deliberately small and safe on partial text (it runs on
every streamed prefix): inline markers never span lines and an unclosed one
stays literal, so a half-written ``**bold`` shows as typed until it closes.
A fenced code block left open (mid-stream, or cut by a message split) is
closed at the end of the chunk, and the next chunk continues it.

It never adds visible characters (markers are dropped, ``- `` becomes
``• ``), so the visible text of a chunk is never longer than its source:
a chunk that fits as plain text fits as HTML too.
"""

from __future__ import annotations

import html
import re

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[ \t]*$")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(?=\S)")

# Inline constructs, tried left to right; each group is formatted recursively
# except code and the link URL.
_INLINE = re.compile(
    r"`(?P<code>[^`\n]+)`"
    r"|\[(?P<link_text>[^\]\n]+)\]\((?P<link_url>https?://[^\s()<>\"]+)\)"
    r"|\*\*(?P<bold>(?=\S)[^\n]+?(?<=\S))\*\*"
    r"|__(?P<bold2>(?=\S)[^\n]+?(?<=\S))__"
    r"|~~(?P<strike>(?=\S)[^\n]+?(?<=\S))~~"
    r"|(?<![\w*])\*(?P<italic>(?=[^\s*])[^*\n]*?(?<=[^\s*]))\*(?![\w*])"
    r"|(?<![\w_])_(?P<italic2>(?=[^\s_])[^_\n]*?(?<=[^\s_]))_(?![\w_])"
)

_TAG = re.compile(r"<[^>]*>")

_TAG_FOR_GROUP = {
    "bold": "b",
    "bold2": "b",
    "strike": "s",
    "italic": "i",
    "italic2": "i",
}


def escape(text: str) -> str:
    """Escape text for Telegram HTML (only these three are required, and ``"`` in attributes)."""
    return html.escape(text, quote=False)


def _inline(text: str) -> str:
    out: list[str] = []
    position = 0
    for match in _INLINE.finditer(text):
        out.append(escape(text[position : match.start()]))
        position = match.end()
        kind = match.lastgroup
        if kind == "code":
            out.append(f"<code>{escape(match['code'])}</code>")
        elif kind in ("link_text", "link_url"):
            url = html.escape(match["link_url"], quote=True)
            out.append(f'<a href="{url}">{_inline(match["link_text"])}</a>')
        elif kind is not None:
            tag = _TAG_FOR_GROUP[kind]
            out.append(f"<{tag}>{_inline(match[kind])}</{tag}>")
    out.append(escape(text[position:]))
    return "".join(out)


def _line(line: str) -> str:
    heading = _HEADING.match(line)
    if heading:
        return f"<b>{_inline(heading.group(2))}</b>"
    bullet = _BULLET.match(line)
    if bullet:
        return f"{bullet.group(1)}• {_inline(line[bullet.end() :])}"
    return _inline(line)


def visible_text(html_text: str) -> str:
    """What a reader sees of our own HTML: tags dropped, entities decoded."""
    return html.unescape(_TAG.sub("", html_text))


def open_fence_after(text: str, open_fence: str | None = None) -> str | None:
    """The language of the code block still open at the end of ``text`` ("" for none given).

    ``None`` when no block is open. ``open_fence`` is the state at its start.
    """
    state = open_fence
    for line in text.split("\n"):
        fence = _FENCE.match(line)
        if fence:
            state = fence.group(1) if state is None else None
    return state


def _pre(code_lines: list[str], language: str) -> str:
    body = escape("\n".join(code_lines))
    if language:
        lang = html.escape(language, quote=True)
        return f'<pre><code class="language-{lang}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


def markdown_to_html(text: str, open_fence: str | None = None) -> str:
    """Convert ``text`` to Telegram HTML; ``open_fence`` continues a block left open before it."""
    out: list[str] = []
    code: list[str] | None = [] if open_fence is not None else None
    language = open_fence or ""
    for line in text.split("\n"):
        fence = _FENCE.match(line)
        if code is None:
            if fence:
                code, language = [], fence.group(1)
            else:
                out.append(_line(line) + "\n")
        elif fence:
            if code:  # an empty entity would leave nothing visible to show
                out.append(_pre(code, language) + "\n")
            code = None
        else:
            code.append(line)
    if code:
        out.append(_pre(code, language))
    return "".join(out).removesuffix("\n")
