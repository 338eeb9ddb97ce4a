"""The model's Markdown, converted to the HTML subset Telegram accepts.

Parsing is markdown-it-py's (CommonMark, plus GitHub's tables and
strikethrough), so what the model writes means what it means anywhere else:
``***both***`` is bold italic, ``> quotes`` are quotes, ``~~~`` fences are code,
``[x](https://en.wikipedia.org/wiki/Foo_(bar))`` keeps its parentheses. Only
the output is ours: Telegram's HTML subset (``b i s code pre a blockquote``).

HTML rather than MarkdownV2: every character outside a tag only needs ``&``,
``<`` and ``>`` escaped, where MarkdownV2 needs eighteen characters escaped
and rejects a message for any one missed. Raw HTML in the model's text is
shown as text, never passed through.

It runs on every streamed prefix, so it must be safe on partial text: an
unclosed ``**bold`` is literal text until it closes (CommonMark's own rule),
and a code fence left open runs to the end of the chunk. A message split
inside a code block continues it: ``open_fence_after`` finds the fence still
open at the end of the earlier chunks, and the next chunk is parsed with that
fence line put back in front.

Layout follows the source: blocks are separated by the blank lines they had,
list items become ``•`` or their number, headings bold lines, tables a
monospaced block. Visible text is rarely longer than its source; the renderer
(``render``) falls back to plain text when a chunk would no longer fit.

Telegram refuses a whole message for one nesting its "Formatting options"
forbid, and the reply then goes as plain text. Markdown nests more freely, so
the output never holds one (read strictly, as ``bot/testing/telegram_html.py``
checks it): code inside bold, italic or strikethrough closes them around it
and opens them again after it; code or a link inside a link is the link's
text; a quote inside a quote is part of the outer quote. Nothing is ever put
inside ``pre`` or ``code``: their text is escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

_TAG = re.compile(r"<[^>]*>")
# An opening or closing code fence (CommonMark: 3+ backticks or tildes, up to 3 spaces in).
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_LINK_SCHEMES = ("http://", "https://", "tg://", "mailto:")
_BULLET = "•"
_INDENT = "  "
_INLINE_TAGS = {"strong": "b", "em": "i", "s": "s"}
_NEWLINES = re.compile(r"\r\n?")
_EMPTY_TAG = re.compile(r"<(b|i|s)></\1>")
"""Formatting closed around code and opened again with nothing in it: dropped."""

_parser = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


def escape(text: str) -> str:
    """Escape text for Telegram HTML (only ``& < >`` are required outside attributes)."""
    return html.escape(text, quote=False)


def visible_text(html_text: str) -> str:
    """What a reader sees of our own HTML: tags dropped, entities decoded."""
    return html.unescape(_TAG.sub("", html_text))


def open_fence_after(text: str, open_fence: str | None = None) -> str | None:
    """The opening line of the code fence still open at the end of ``text``, or None.

    ``open_fence`` is the fence open at the start of ``text``. A fence closes
    on a line of the same character, at least as long, with nothing after it.
    """
    state = open_fence
    for line in text.split("\n"):
        match = _FENCE.match(line)
        if match is None:
            continue
        marker, rest = match.group(1), match.group(2)
        if state is None:
            if not (marker[0] == "`" and "`" in rest):  # backtick info strings hold no backtick
                state = line.strip()
        else:
            opener = _FENCE.match(state)
            assert opener is not None
            opened = opener.group(1)
            if marker[0] == opened[0] and len(marker) >= len(opened) and not rest.strip():
                state = None
    return state


def markdown_to_html(text: str, open_fence: str | None = None) -> str:
    """Convert ``text`` to Telegram HTML; ``open_fence`` continues a code block left open."""
    source = f"{open_fence}\n{text}" if open_fence is not None else text
    # markdown-it ends lines at \r and \r\n too: the source lines kept for the blank lines
    # between blocks must be the lines it counted.
    source = _NEWLINES.sub("\n", source)
    tree = SyntaxTreeNode(_parser.parse(source))
    rendered = _Blocks(source.split("\n")).render(tree.children, depth=0, quoted=False)
    while _EMPTY_TAG.search(rendered):
        rendered = _EMPTY_TAG.sub("", rendered)
    return rendered.strip("\n")


# -- blocks ---------------------------------------------------------------------------


class _Blocks:
    """Renders block nodes; keeps the source lines to put back the blank lines between blocks."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    def _blank_before(self, node: SyntaxTreeNode) -> bool:
        if not node.map or node.map[0] == 0:
            return False
        return not self._lines[node.map[0] - 1].strip()

    def render(self, nodes: Sequence[SyntaxTreeNode], depth: int, quoted: bool) -> str:
        """Sibling blocks, a line apart, or a blank line apart where the source had one.

        ``quoted``: inside a blockquote already, where another may not open."""
        out: list[str] = []
        for index, node in enumerate(nodes):
            if index:
                out.append("\n\n" if self._blank_before(node) else "\n")
            out.append(self._block(node, depth, quoted))
        return "".join(out)

    def _block(self, node: SyntaxTreeNode, depth: int, quoted: bool) -> str:
        kind = node.type
        if kind == "paragraph":
            return _inline_children(node, ())
        if kind == "heading":
            return f"<b>{_inline_children(node, ('b',))}</b>"
        if kind in ("fence", "code_block"):
            return _pre(node.content.removesuffix("\n"), node.info.strip().split(" ")[0])
        if kind == "blockquote":
            inner = self.render(node.children, depth, quoted=True)
            return inner if quoted else f"<blockquote>{inner}</blockquote>"
        if kind in ("bullet_list", "ordered_list"):
            return self._list(node, depth, quoted)
        if kind == "table":
            return _table(node)
        if kind == "hr":
            return "———"
        if kind == "html_block":
            return escape(node.content.rstrip("\n"))
        return self.render(node.children, depth, quoted)

    def _list(self, node: SyntaxTreeNode, depth: int, quoted: bool) -> str:
        lines: list[str] = []
        number = int(node.attrs.get("start", 1) or 1)
        for item in node.children:
            marker = _BULLET if node.type == "bullet_list" else f"{number}."
            number += 1
            body = self.render(item.children, depth + 1, quoted)
            indent = _INDENT * depth
            lines.append(f"{indent}{marker} {body}" if body else f"{indent}{marker}")
        return "\n".join(lines)


def _pre(code: str, language: str) -> str:
    if not code.strip():
        return ""  # an empty entity would leave nothing to show
    body = escape(code)
    if language:
        lang = html.escape(language, quote=True)
        return f'<pre><code class="language-{lang}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


def _table(node: SyntaxTreeNode) -> str:
    """A table as aligned monospaced columns: Telegram has no table entity."""
    rows: list[list[str]] = []
    for section in node.children:  # thead, tbody
        for row in section.children:
            rows.append([visible_text(_inline_children(cell, ())) for cell in row.children])
    if not rows:
        return ""
    columns = max(len(row) for row in rows)
    widths = [max(len(row[i]) if i < len(row) else 0 for row in rows) for i in range(columns)]
    lines = [
        " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return _pre("\n".join(lines), "")


# -- inline ---------------------------------------------------------------------------


def _inline_children(node: SyntaxTreeNode, open_tags: tuple[str, ...]) -> str:
    """``open_tags``: the inline tags around ``node``, outermost first (``b i s a``)."""
    return "".join(_inline(child, open_tags) for child in node.children)


def _inline(node: SyntaxTreeNode, open_tags: tuple[str, ...]) -> str:
    kind = node.type
    if kind == "inline":
        return _inline_children(node, open_tags)
    if kind == "text":
        return escape(node.content)
    if kind in ("softbreak", "hardbreak"):
        return "\n"
    if kind == "code_inline":
        return _code(escape(node.content), open_tags)
    if kind in _INLINE_TAGS:
        tag = _INLINE_TAGS[kind]
        inner = _inline_children(node, (*open_tags, tag))
        return f"<{tag}>{inner}</{tag}>" if inner else ""
    if kind in ("link", "image"):
        url = str(node.attrs.get("href" if kind == "link" else "src", ""))
        inner = _inline_children(node, (*open_tags, "a"))
        # A link inside a link (an image in one) is its text: links do not nest.
        if "a" in open_tags or not url.lower().startswith(_LINK_SCHEMES) or not inner:
            return inner
        return f'<a href="{html.escape(url, quote=True)}">{inner}</a>'
    if kind == "html_inline":
        return escape(node.content)
    return _inline_children(node, open_tags)


def _code(body: str, open_tags: tuple[str, ...]) -> str:
    """Inline code where ``open_tags`` are open: a link holds no code (its text stays,
    linked); bold, italic and strikethrough hold none either, so they close around it."""
    if "a" in open_tags:
        return body
    closing = "".join(f"</{tag}>" for tag in reversed(open_tags))
    opening = "".join(f"<{tag}>" for tag in open_tags)
    return f"{closing}<code>{body}</code>{opening}"
