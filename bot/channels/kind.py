"""What every kind of channel shares: its name, the type of its settings tables, its wiring.

Each channel folder declares its kind beside its settings (``TELEGRAM`` at the end of
``bot/channels/telegram/settings.py``; ``API`` and ``OPENAI``, which have no settings,
in their folder's ``kind.py``). Its ``routes.py`` has ``setup``: its HTTP routes, and its
turn channels registered with the turn service. Where the platform's credentials can be
checked from here, its ``doctor.py`` has ``check``.

``bot.app.add_channels`` hands every kind's tables to its ``setup`` and
``bot.doctor.walk`` the checked kinds' tables to their ``check``: each call is written
out, so a reader or a type checker follows it from the app to the platform.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import aiohttp

    from bot.http.settings import ServerSettings
    from bot.turns.replies import Channel
    from bot.turns.service import TurnService

Table = TypeVar("Table")
Opened = TypeVar("Opened", bound="Channel")
DoctorCheck = Callable[["aiohttp.ClientSession", Any, "str | None"], Awaitable[str]]
"""``check(http, table, public_url)``: one line on the platform's view of the table's
credentials and webhook; raises ``bot.errors.DoctorFailure`` when wrong."""


@dataclass(frozen=True)
class Wiring:
    """What every channel's ``routes.setup`` is given beside its own tables."""

    server: ServerSettings
    turns: TurnService
    http: aiohttp.ClientSession
    """The outbound client the platforms' APIs and callbacks are called with."""


def unique_names(tables: list[Any]) -> list[Any]:
    # Names are URL segments, channel ids and persona names: two tables with one name
    # would collide.
    counts = Counter(table.name for table in tables)
    repeated = sorted(name for name, count in counts.items() if count > 1)
    if repeated:
        raise ValueError(f"names must be unique; repeated: {', '.join(repeated)}")
    return tables


@dataclass(frozen=True)
class ChannelKind(Generic[Table]):
    name: str
    """Its folder under ``bot/channels``, and the prefix of its turn channels' names
    (``telegram`` of ``telegram:support``)."""
    table: type[Table] | None = None
    """The type of one of its ``[[tables]]`` (``bot.config.Settings``), one per configured
    instance; None: the channel is not configured per instance."""

    def register(
        self, tables: list[Table], wiring: Wiring, open_channel: Callable[[Table], Opened]
    ) -> list[Opened]:
        """One turn channel per configured table, each registered with the turn service."""
        channels = [open_channel(table) for table in tables]
        for channel in channels:
            wiring.turns.register_channel(channel)
        return channels
