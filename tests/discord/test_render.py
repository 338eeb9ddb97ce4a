"""Discord's Markdown: what would come out wrong is changed, code never is."""

from __future__ import annotations

from bot.channels.discord.deliveries import first_piece
from bot.channels.discord.render import render


def test_plain_markdown_goes_out_as_written() -> None:
    text = "**bold** and *italic*, `code`, a [link](https://example.com)\n\n# Title\n- item"
    assert render(text) == text


def test_code_blocks_are_kept_verbatim_and_an_open_one_is_closed() -> None:
    code = "```python\nx = '<@123>' | 1\n#### not a heading\n```"
    assert render(code) == code
    assert render("Here:\n```py\nprint(1)") == "Here:\n```py\nprint(1)\n```"


def test_a_table_goes_in_a_code_block() -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    assert render(f"Look:\n{table}\nDone") == f"Look:\n```\n{table}\n```\nDone"


def test_deep_headings_images_and_pills_are_made_safe() -> None:
    assert render("#### Deep heading") == "**Deep heading**"
    assert render("![a cat](https://x.test/cat.png)") == "[a cat](https://x.test/cat.png)"
    assert render("ping <@123> and <#456> and <@&789>") == (
        "ping \\<@123> and \\<#456> and \\<@&789>"
    )
    assert render("inline `<@123>` stays") == "inline `<@123>` stays"


def test_a_cut_inside_a_code_block_closes_and_reopens_it() -> None:
    text = "intro\n```\n" + "line of code\n" * 30 + "```\nafter"
    first, cut = first_piece(text, 120)
    assert cut is not None and len(first) <= 120
    assert first.count("```") == 2
    assert cut.carry.startswith("```")
