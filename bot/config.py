"""Settings: one typed object, loaded from TOML, overridden by ``BOT_*`` env vars.

Precedence, highest first: environment (``BOT_ENGINE__MAX_MODEL_LEN=4096``;
a double underscore separates section and key), the TOML file
(``--config``, or ``BOT_CONFIG``; ``botctl`` also finds ``./bot.toml``, see
``find_config``), then the defaults below. A secret setting
may also come from a file: ``BOT_..._FILE``, a ``key_file`` in the TOML file,
a systemd credential or a Docker secret (``bot.secret_files`` says where and in
which order). Everything is validated at start-up; ``load_settings`` raises
``ConfigError`` with a message that names each bad key.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from bot.channels.discord.settings import DiscordBotSettings
from bot.channels.kind import unique_names
from bot.channels.slack.settings import SlackAppSettings
from bot.channels.telegram.settings import TelegramBotSettings
from bot.channels.webhook.settings import WebhookSettings
from bot.engine.settings import DEFAULT_DATA_DIR, DEFAULT_DEMO_MODEL_DIR, EngineSettings
from bot.http.settings import ServerSettings
from bot.secret_files import SecretFileError, file_variables, read_secret_files
from bot.storage.db import is_sqlite
from bot.turns.personas import PersonaSettings
from bot.turns.settings import (
    CompactionSettings,
    GenerationSettings,
    LimitSettings,
    PendingMessages,
    TenancySettings,
    WorkerSettings,
)

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_DATA_DIR",
    "DEFAULT_DEMO_MODEL_DIR",
    "ConfigError",
    "EngineSettings",
    "GenerationSettings",
    "ServerSettings",
    "Settings",
    "WorkerSettings",
    "find_config",
    "load_settings",
]

DEFAULT_DATABASE_URL = f"sqlite+aiosqlite:///{DEFAULT_DATA_DIR / 'bot.db'}"
DEFAULT_CONFIG_FILE = Path("bot.toml")
"""The file ``botctl`` reads when neither ``--config`` nor ``BOT_CONFIG`` names one: the
one ``make run`` writes (``botctl init``), so every command sees the settings it serves."""
CONFIG_ENV = "BOT_CONFIG"
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly."


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatabaseSettings(_Section):
    url: str = Field(DEFAULT_DATABASE_URL, json_schema_extra={"secret": True})
    """Secret: it may carry the password (``bot.secret_files`` reads it from a file too)."""
    password: SecretStr | None = None
    """The password of ``url``'s user, kept out of the URL: it may then come from a file of
    its own (a Docker secret, a systemd credential), and never needs escaping into a URL
    (``@``, ``/``, ``%``). Put into ``url`` when the settings are loaded."""
    echo: bool = False

    @model_validator(mode="after")
    def _password_into_url(self) -> DatabaseSettings:
        if self.password is None:
            return self
        try:
            url = make_url(self.url)
        except (ArgumentError, ValueError):
            raise ValueError("url is not a database URL") from None
        if url.get_backend_name() == "sqlite":
            raise ValueError("password is for PostgreSQL: an SQLite database takes none")
        password = self.password.get_secret_value()
        if url.password is not None and url.password != password:
            raise ValueError("url carries another password than password: give one of them")
        # SQLAlchemy escapes the password as a URL needs it.
        self.url = url.set(password=password).render_as_string(hide_password=False)
        return self


class ChatSettings(_Section):
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    pending_messages: PendingMessages = "one_by_one"
    """Messages that pile up while a reply is generating: ``coalesce`` answers them in one turn."""


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["auto", "json", "console"] = "auto"
    """auto: JSON lines when stdout is not a terminal, coloured console when it is."""


Table = TypeVar("Table")
Tables = Annotated[list[Table], AfterValidator(unique_names)]
"""``[[tables]]`` (a channel's, one per configured instance, or the personas), each named apart."""


class CoreSettings(BaseSettings):
    """Every section but the channels' tables (``Settings`` adds those)."""

    model_config = SettingsConfigDict(
        env_prefix="BOT_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    workers: WorkerSettings = Field(default_factory=WorkerSettings)
    chat: ChatSettings = Field(default_factory=ChatSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    tenancy: TenancySettings = Field(default_factory=TenancySettings)
    personas: Tables[PersonaSettings] = Field(default_factory=list)
    """System-prompt presets a conversation can be started with (``/mode NAME``, ``persona``)."""

    @model_validator(mode="after")
    def _ingress_only_needs_postgresql(self) -> CoreSettings:
        if not self.workers.run_turns and is_sqlite(self.database.url):
            # SQLite serves one process (its lock file): no other process could run the turns.
            raise ValueError(
                "workers.run_turns = false needs PostgreSQL: on SQLite the one `botctl serve`"
                " runs every turn"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML document arrives as init kwargs; the environment wins over it. The
        # secrets' BOT_..._FILE variables are read into the document (bot.secret_files).
        return (_EnvWithoutSecretFiles(settings_cls), init_settings)


class _EnvWithoutSecretFiles(EnvSettingsSource):
    """The ``BOT_*`` environment, less the ``BOT_..._FILE`` variables of secret settings
    (``bot.secret_files`` reads those files; here they would be unknown keys)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        skipped = file_variables(self.settings_cls)
        return {
            name: value
            for name, value in super()._load_env_vars().items()
            if name.lower() not in skipped
        }


class Settings(CoreSettings):
    """Every section, and each configured channel's tables (``bot.channels.kind``)."""

    telegram: Tables[TelegramBotSettings] = Field(default_factory=list)
    slack: Tables[SlackAppSettings] = Field(default_factory=list)
    discord: Tables[DiscordBotSettings] = Field(default_factory=list)
    webhooks: Tables[WebhookSettings] = Field(default_factory=list)


class ConfigError(Exception):
    """The configuration is invalid; the message names every bad key."""


def _format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(root)"
        lines.append(f"  {key}: {item['msg']}")
    return "\n".join(lines)


def find_config(path: str | Path | None) -> str | Path | None:
    """The config file a command uses: ``path`` (``--config``), else ``$BOT_CONFIG``, else
    ``./bot.toml`` when it exists; None for the built-in defaults.

    ``BOT_CONFIG`` set but empty means no file at all (``./bot.toml`` is not looked for).
    """
    if path:
        return path
    if CONFIG_ENV in os.environ:
        return os.environ[CONFIG_ENV] or None
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load and validate settings from ``path`` (or ``$BOT_CONFIG``) and the environment.

    ``overrides`` are top-level sections given as dicts, applied over the file
    (tests use this instead of writing files).
    """
    path = path or os.environ.get("BOT_CONFIG")
    document: dict[str, Any] = {}
    source = "defaults and environment"
    if path:
        path = Path(path)
        source = str(path)
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(document.get(section), dict):
            document[section] = {**document[section], **values}
        else:
            document[section] = values
    try:
        document = read_secret_files(document, Settings, os.environ)
        return Settings(**document)
    except SecretFileError as exc:
        raise ConfigError(f"invalid configuration ({source}): {exc}") from None
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from exc
