"""A reply's timing bar in real headless Chromium: every layer the server times shows in it.

The bar is the page's answer to "where did this reply's time go": a layer it leaves
out (a turn's wait for SQLite's write lock, a long chat's compaction) would make the
largest share of a slow reply disappear from the picture.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Page

from bot.turns.timing import LAYERS

pytestmark = pytest.mark.browser

RENDER = """
async (timings) => {
  const { renderTiming } = await import('/static/timing.js');
  const usage = { prompt_tokens: 40, cached_tokens: 32, completion_tokens: 6 };
  const figure = renderTiming(usage, timings);
  document.body.replaceChildren(figure);
  figure.open = true;
  const legend = [...figure.querySelectorAll('.timing-legend li')];
  return [...figure.querySelectorAll('.timing-bar .layer')].map((part, index) => ({
    name: part.dataset.layer,
    width: part.getBoundingClientRect().width,
    colour: getComputedStyle(part).backgroundColor,
    legend: legend[index].textContent,
  }));
}
"""

TRANSPARENT = "rgba(0, 0, 0, 0)"


async def render(page: Page, timings: dict[str, float]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = await page.evaluate(RENDER, timings)
    return parts


async def test_every_layer_the_server_times_shows_in_order_in_its_own_colour(
    page: Page,
) -> None:
    timings = {layer: 2.0 + index for index, layer in enumerate(LAYERS)}
    parts = await render(page, {**timings, "ttft": 30.0, "e2e": 90.0})

    assert [part["name"] for part in parts] == list(LAYERS)  # ttft and e2e are not layers
    assert all(part["width"] > 0 for part in parts)
    colours = [part["colour"] for part in parts]
    assert TRANSPARENT not in colours
    assert len(set(colours)) == len(LAYERS), colours
    for part in parts:
        # Named and explained: "<layer>: <ms> — <what it is>", not the bare name.
        name, _, label = part["legend"].partition(" — ")
        assert name.startswith(f"{part['name']}: "), part
        assert label and label != part["name"], part


async def test_a_layer_the_page_does_not_know_still_shows(page: Page) -> None:
    parts = await render(page, {"persist": 1.0, "new_layer": 4.0, "decode": 3.0, "e2e": 9.0})

    assert [part["name"] for part in parts] == ["persist", "decode", "new_layer"]
    unknown = parts[-1]
    assert unknown["width"] > 0 and unknown["colour"] != TRANSPARENT
    assert unknown["legend"].startswith("new_layer: 4.0 ms")


async def test_layers_with_no_time_are_left_out(page: Page) -> None:
    parts = await render(page, {"wait": 0.0, "start": 0.0, "compact": 0.0, "decode": 5.0})

    assert [part["name"] for part in parts] == ["decode"]
