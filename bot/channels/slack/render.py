"""What one Slack message of a reply is sent as: a ``markdown`` block, with plain text beside it.

Slack's Block Kit ``markdown`` block takes standard Markdown and renders it
the way Slack's own AI replies look (it is meant for LLM output), so the
model's Markdown goes in as written: no hand conversion to mrkdwn to get wrong.
The message's top-level ``text`` is the same reply as plain text (markup
dropped, link targets kept in brackets): Slack shows it in notifications and
where the block cannot be drawn.

A block holds at most 12,000 characters; a longer message (only with
``max_message_chars`` raised past that) goes as the plain text alone.
``&``, ``<`` and ``>`` are escaped in ``text``, where Slack would otherwise
read ``<!channel>`` as a mention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

MARKDOWN_BLOCK_MAX_CHARS = 12_000
"""Slack's limit on a ``markdown`` block's text."""

_parser = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_BLANK_LINES = re.compile(r"\n{3,}")


@dataclass(frozen=True)
class SlackMessage:
    text: str
    """Plain text: notifications, and the message itself where blocks cannot be drawn."""
    blocks: list[dict[str, Any]] | None = field(default=None)


def escape(text: str) -> str:
    """Escape the three characters Slack reads as markup in message text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_reply(markdown: str) -> SlackMessage:
    """The message for ``markdown``: a markdown block when it fits, with its plain text."""
    text = escape(plain_text(markdown))
    source = markdown.strip()
    if not source or len(source) > MARKDOWN_BLOCK_MAX_CHARS:
        return SlackMessage(text)
    return SlackMessage(text, [{"type": "markdown", "text": source}])


def plain_text(markdown: str) -> str:
    """``markdown`` as a reader would say it: markup dropped, lists and tables kept legible."""
    out: list[str] = []
    lists: list[list[int]] = []  # per open list: [next number] or [] for bullets
    first_cell = True
    for token in _parser.parse(markdown):
        kind = token.type
        if kind == "inline":
            out.append(_inline(token.children or []))
        elif kind in ("fence", "code_block"):
            out.append(token.content.rstrip("\n") + "\n")
        elif kind in ("paragraph_close", "heading_close"):
            out.append("\n" if token.hidden or lists else "\n\n")
        elif kind == "bullet_list_open":
            lists.append([])
        elif kind == "ordered_list_open":
            lists.append([int(token.attrs.get("start", 1) or 1)])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
            out.append("" if lists else "\n")
        elif kind == "list_item_open":
            numbering = lists[-1]
            marker = f"{numbering[0]}." if numbering else "•"
            if numbering:
                numbering[0] += 1
            out.append(f"{'  ' * (len(lists) - 1)}{marker} ")
        elif kind == "tr_open":
            first_cell = True
        elif kind in ("th_open", "td_open"):
            out.append("" if first_cell else " | ")
            first_cell = False
        elif kind in ("tr_close", "table_close"):
            out.append("\n")
        elif kind == "hr":
            out.append("———\n")
        elif kind == "html_block":
            out.append(token.content)
    return _BLANK_LINES.sub("\n\n", "".join(out)).strip()


def _inline(children: list[Token]) -> str:
    out: list[str] = []
    link: str | None = None
    for child in children:
        kind = child.type
        if kind in ("text", "code_inline", "html_inline"):
            out.append(child.content)
        elif kind in ("softbreak", "hardbreak"):
            out.append("\n")
        elif kind == "link_open":
            link = str(child.attrs.get("href", ""))
            out.append("\ue000")  # where the label starts, to compare it with the target
        elif kind == "link_close" and link is not None:
            start = max(i for i, part in enumerate(out) if part == "\ue000")
            label = "".join(out[start + 1 :])
            out[start:] = [label if label == link or not link else f"{label} ({link})"]
            link = None
        elif kind == "image":
            out.append(child.content or str(child.attrs.get("src", "")))
    return "".join(out)
