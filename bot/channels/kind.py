"""What a kind of channel brings to the service: its settings table, its routes, its doctor check.

Every channel folder has the same files for the same jobs: ``settings.py`` (the
type of one ``[[section]]`` table, when the channel is configured per instance),
``routes.py`` (``setup``: its HTTP routes, and its turn channels registered with
the turn service) and, where the platform's credentials can be checked from
here, ``doctor.py`` (``check``). ``bot.channels.registry`` lists the kinds.

Routes and doctor checks are imported when used: every routes module imports the
registry for its kind, and ``bot.config`` reads the registry for the table types
without loading the whole service.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar, cast

from pydantic import AfterValidator, Field

if TYPE_CHECKING:
    import aiohttp
    from pydantic import BaseModel

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
    section: str | None = None
    """The settings key of its ``[[tables]]``, one per configured instance."""
    table: type[Table] | None = None
    has_doctor: bool = False

    def settings_field(self) -> tuple[Any, Any]:
        """The type and default of ``section`` in ``bot.config.Settings``."""
        field_type = Annotated[list[self.table], AfterValidator(unique_names)]  # type: ignore[name-defined]
        return field_type, Field(default_factory=list)

    def tables(self, settings: BaseModel) -> list[Table]:
        """Its tables in the loaded configuration (``bot.config.Settings``, read by name)."""
        return cast(list[Table], getattr(settings, self.section)) if self.section else []

    def register(
        self, tables: list[Table], wiring: Wiring, open_channel: Callable[[Table], Opened]
    ) -> list[Opened]:
        """One turn channel per configured table, each registered with the turn service."""
        channels = [open_channel(table) for table in tables]
        for channel in channels:
            wiring.turns.register_channel(channel)
        return channels

    def routes(self) -> Any:
        """Its ``routes`` module: ``setup(app, tables, wiring)``."""
        return importlib.import_module(f"bot.channels.{self.name}.routes")

    @property
    def doctor(self) -> DoctorCheck | None:
        module = f"bot.channels.{self.name}.doctor"
        return cast(DoctorCheck, importlib.import_module(module).check) if self.has_doctor else None
