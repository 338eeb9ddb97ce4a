"""What a person sees of the page, measured in the browser: pixels, lines, colours.

The measuring scripts are generic (header, composer, turns, the viewport), so
they measure any version of the page the same way.
"""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page

# Pixels of the newest turn's reply and of the controls under it that a person cannot
# see: above the header's bottom or the viewport's top, below the message box's top or
# the viewport's bottom. Also whether the reply fits the space between at all.
HIDDEN_OF_NEWEST = """
() => {
  const turns = document.querySelectorAll('.turn');
  const turn = turns[turns.length - 1];
  if (!turn) return null;
  const header = document.querySelector('header').getBoundingClientRect();
  const composer = document.getElementById('composer').getBoundingClientRect();
  const top = Math.max(0, header.bottom);
  const bottom = Math.min(window.innerHeight, composer.top);
  const parts = [turn.querySelector('.bubble.bot'), turn.querySelector('.turn-controls')];
  let hidden = 0;
  let height = 0;
  for (const part of parts) {
    if (!part) continue;
    const box = part.getBoundingClientRect();
    if (box.height === 0) continue;
    const seen = Math.max(0, Math.min(box.bottom, bottom) - Math.max(box.top, top));
    hidden += box.height - seen;
    height += box.height;
  }
  return { hidden: Math.round(hidden * 10) / 10, height, room: bottom - top };
}
"""

# From now on, every animation frame records what HIDDEN_OF_NEWEST says while the newest
# reply streams. A frame callback registered in the frame before runs before the page's
# own callbacks of this frame: it measures what the last frame painted.
RECORD_WHILE_STREAMING = (
    """
() => {
  const measure = """
    + HIDDEN_OF_NEWEST
    + """;
  window.streamingFrames = [];
  const record = () => {
    if (document.querySelector('.turn:last-child .bubble.bot.streaming')) {
      window.streamingFrames.push(measure());
    }
    requestAnimationFrame(record);
  };
  requestAnimationFrame(record);
}
"""
)

# Where the first turn is on screen: it moves when (and only when) the view scrolls.
FIRST_TURN_TOP = "() => document.querySelector('.turn').getBoundingClientRect().top"

# The header's visible children, each as its box: on one line when every box starts
# above every other's bottom.
HEADER_BOXES = """
() => {
  const header = document.querySelector('header');
  const boxes = [...header.querySelectorAll('*')]
    .filter((el) => el.children.length === 0 || el.tagName === 'BUTTON' || el.tagName === 'SELECT')
    .map((el) => el.getBoundingClientRect())
    .filter((box) => box.width > 0 && box.height > 0);
  const own = header.getBoundingClientRect();
  return {
    header: { top: own.top, bottom: own.bottom, height: own.height },
    boxes: boxes.map((b) => ({ top: b.top, bottom: b.bottom, left: b.left, right: b.right })),
  };
}
"""


def on_one_line(measured: dict[str, Any]) -> bool:
    boxes = measured["boxes"]
    return bool(boxes) and max(b["top"] for b in boxes) < min(b["bottom"] for b in boxes)


async def hidden_of_newest(page: Page) -> dict[str, float]:
    measured: dict[str, float] = await page.evaluate(HIDDEN_OF_NEWEST)
    return measured


def luminance(css: str) -> float:
    """WCAG relative luminance of an ``rgb(...)``/``rgba(...)`` colour."""
    numbers = css[css.index("(") + 1 : css.index(")")].replace(",", " ").split()
    channels = []
    for value in numbers[:3]:
        c = float(value) / 255
        channels.append(c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4)
    r, g, b = channels
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(foreground: str, background: str) -> float:
    lighter, darker = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


# The colour a person sees behind an element: its own background, else its nearest
# ancestor's that is not transparent, else the canvas (white).
COLOURS_OF = """
(selector) => {
  const element = document.querySelector(selector);
  if (!element) return null;
  let node = element;
  let background = 'rgb(255, 255, 255)';
  while (node && node.nodeType === 1) {
    const colour = getComputedStyle(node).backgroundColor;
    if (colour !== 'rgba(0, 0, 0, 0)' && colour !== 'transparent') { background = colour; break; }
    node = node.parentElement;
  }
  if (!node || node.nodeType !== 1) {
    const canvas = getComputedStyle(document.documentElement).backgroundColor;
    if (canvas !== 'rgba(0, 0, 0, 0)') background = canvas;
  }
  return { text: getComputedStyle(element).color, background };
}
"""
