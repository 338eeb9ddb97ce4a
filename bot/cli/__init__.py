"""``botctl``: every command in one package, mounted from one list (``bot.cli.main.COMMANDS``)."""

from bot.cli.main import DISTRIBUTION, main

__all__ = ["DISTRIBUTION", "main"]
