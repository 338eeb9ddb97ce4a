"""The platforms' side of bench/load.py: Telegram's and Slack's strict fakes (bot/testing/).

A turn that answers in a Telegram or Slack chat makes a few calls to the platform's
API (a message, its edits or stream appends). The real platforms answer those calls
on their own machines; served from the service's process, the fakes' answers would run
on the service's event loop beside the acks bench/load.py measures, and count as the
service's time. So by default they run here, in a process of their own
(``FakesProcess``); ``InProcessFakes`` serves them from the caller's loop, as
bench/load.py did before, to compare.

Protocol (``JsonLinesProcess``): any line on stdin is answered with the fakes' base
URLs; end of stdin ends the process.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, Self

from harness import LOOPS, JsonLinesProcess, answer_json_lines, run_on
from load_client import SLACK_BOT_USER, SLACK_USER

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram

TELEGRAM_TOKEN = "7000000002:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDload"
TELEGRAM_USERNAME = "LoadBot"
SLACK_TOKEN = "xoxb-load-0001"
SLACK_TEAM = "T0001TEAM"


@dataclass(frozen=True)
class FakeUrls:
    """Where the service finds each platform's API (its ``api_base_url``)."""

    telegram: str
    slack: str


class PlatformFakes(Protocol):
    """The fakes, serving from ``async with`` to its end."""

    urls: FakeUrls

    @property
    def pid(self) -> int | None:
        """The process they serve from (None: the caller's own)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


class InProcessFakes:
    """The fakes on the calling event loop: one bot and one workspace with one user."""

    def __init__(self) -> None:
        self._telegram = FakeTelegram()
        self._slack = FakeSlackApi()
        self.urls = FakeUrls("", "")

    @property
    def pid(self) -> int | None:
        return None

    async def __aenter__(self) -> Self:
        await self._telegram.__aenter__()
        self._telegram.add_bot(TELEGRAM_TOKEN, TELEGRAM_USERNAME)
        self._slack.add_workspace(SLACK_TOKEN, SLACK_TEAM, bot_user_id=SLACK_BOT_USER)
        self._slack.add_user(SLACK_TEAM, SLACK_USER, display_name="Alice")
        self.urls = FakeUrls(self._telegram.base_url, await self._slack.start())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._slack.close()
        await self._telegram.__aexit__(None, None, None)


class FakesProcess:
    """The same fakes served from a process of its own: this file, run as a script."""

    def __init__(self, loop: str) -> None:
        self._process = JsonLinesProcess(__file__, ["--loop", loop], {})
        self.urls = FakeUrls("", "")

    @property
    def pid(self) -> int | None:
        return self._process.pid

    async def __aenter__(self) -> Self:
        await self._process.__aenter__()
        self.urls = FakeUrls(**await self._process.ask({}))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._process.__aexit__(*exc_info)


async def serve() -> None:
    """The fakes' process: serves until its stdin ends, telling its URLs to any line."""
    async with InProcessFakes() as fakes:

        async def urls(_: object) -> dict[str, str]:
            return asdict(fakes.urls)

        await answer_json_lines(urls)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    run_on(parser.parse_args().loop, serve())
