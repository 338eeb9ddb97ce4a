"""What one chunk of a reply is sent as: HTML from the model's Markdown, or plain text.

A reply is split on its source text (``splitting``), and each chunk is
rendered on its own, continuing a code block the chunk before left open. A
chunk whose rendering would be longer than a message may be (a table padded
into columns) goes as typed.
``Renderer.plain`` switches a reply to plain text for good once Telegram has
refused its entities, so one bad construct costs one refused call, not one a
chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.channels.telegram.formatting import markdown_to_html, open_fence_after, visible_text
from bot.channels.telegram.splitting import MAX_MESSAGE_CHARS, split_message, utf16_len


@dataclass(frozen=True)
class Rendered:
    text: str
    parse_mode: str | None

    def params(self) -> dict[str, str]:
        if self.parse_mode is None:
            return {"text": self.text}
        return {"text": self.text, "parse_mode": self.parse_mode}


class Renderer:
    def __init__(self, fmt: str = "html", limit: int = MAX_MESSAGE_CHARS) -> None:
        self.plain = fmt != "html"
        self._limit = limit

    def split(self, text: str) -> list[str]:
        return split_message(text, self._limit)

    def render(self, chunks: list[str], index: int) -> Rendered | None:
        """Chunk ``index`` as sent; None when nothing of it would be visible."""
        raw = chunks[index].strip()
        if not raw:
            return None
        if self.plain:
            return Rendered(raw, None)
        fence = open_fence_after("".join(chunks[:index])) if index else None
        source = markdown_to_html(raw, open_fence=fence)
        visible = visible_text(source)
        if not visible.strip():
            return None
        if utf16_len(visible) > self._limit:
            # Rendering grew the chunk past the limit (a padded table): send it as typed.
            return Rendered(raw, None)
        return Rendered(source, "HTML")
