"""Secret settings from files: ``*_file`` keys, systemd credentials, Docker secrets.

Every secret setting (each ``SecretStr`` field, and ``database.url``, which
carries a password) can come from a file, so that no secret has to sit in the
TOML file, in an environment block (which every child process inherits and
``docker inspect`` prints) or on a command line. Where a secret is looked for,
first found wins:

1. the environment: ``BOT_SECTION__KEY`` (the value) or ``BOT_SECTION__KEY_FILE``
   (a file to read);
2. the TOML file: ``key = "..."`` or ``key_file = "/path"``, in its section or,
   for a channel's tables (``[[telegram]]``, ``[[slack]]``, ``[[webhooks]]``,
   ...), in its table;
3. ``$CREDENTIALS_DIRECTORY/NAME``: systemd's ``LoadCredential=NAME:/path``;
4. ``$BOT_SECRETS_DIR/NAME``, by default ``/run/secrets/NAME``: Docker's and
   Compose's ``secrets:``;
5. the default.

``NAME`` is the setting's dotted name: ``database.url``, ``database.password``,
``engine.api_key``, ``tenancy.cache_salt_secret``; in a channel's table, with
the table's name: ``telegram.support.token``, ``slack.acme.signing_secret``,
``webhooks.crm.secret``. A value and a file for the same key in one place is an
error, as is a file that cannot be read (the message names the key and the
path, never the content). A file's trailing line break is dropped; a list
setting (``previous_secrets``) takes one secret a line.

``scrub_environment`` then removes the secrets' variables from the serving
process's environment, so that nothing it starts (vLLM's engine processes)
inherits them.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

ENV_PREFIX = "BOT_"
ENV_DELIMITER = "__"
FILE_SUFFIX = "_file"
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"
SECRETS_DIR_ENV = "BOT_SECRETS_DIR"
DEFAULT_SECRETS_DIR = Path("/run/secrets")


class SecretFileError(ValueError):
    """A secret's file cannot be used; the message names the key and the path."""


@dataclass(frozen=True)
class SecretKey:
    """One secret setting: ``section.key``, or a key of each of a section's tables."""

    section: str
    key: str
    in_tables: bool
    """The section is a list of named tables (a channel's ``[[telegram]]``)."""
    is_list: bool

    @property
    def env_name(self) -> str:
        return f"{ENV_PREFIX}{self.section}{ENV_DELIMITER}{self.key}".upper()

    def file_name(self, table: str | None = None) -> str:
        """The credential's (or Docker secret's) file name."""
        return ".".join(part for part in (self.section, table, self.key) if part)


def _mentions_secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    return any(_mentions_secret(arg) for arg in typing.get_args(annotation))


def _is_secret(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    marked = isinstance(extra, dict) and extra.get("secret") is True
    return marked or _mentions_secret(field.annotation)


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the section's model, whether it is a list of tables) of a settings field."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found, _ = _model_of(arg)
            if found is not None:
                return found, False
    if origin is list:
        [item] = typing.get_args(annotation)
        found, _ = _model_of(item)
        return found, found is not None
    return None, False


def secret_keys(settings: type[BaseModel]) -> list[SecretKey]:
    """Every secret setting of ``settings`` (the sections' and the channel tables')."""
    found: list[SecretKey] = []
    for section, field in settings.model_fields.items():
        model, in_tables = _model_of(field.annotation)
        if model is None:
            continue
        for key, inner in model.model_fields.items():
            if _is_secret(inner):
                is_list = typing.get_origin(inner.annotation) is list
                found.append(SecretKey(section, key, in_tables, is_list))
    return found


def _read(path: Path, where: str, key: SecretKey) -> str | list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretFileError(f"{where}: cannot read {path} ({type(exc).__name__})") from None
    if key.is_list:
        return [line for line in text.splitlines() if line]
    return text.removesuffix("\n").removesuffix("\r")


def _tables(
    document: dict[str, Any], key: SecretKey
) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """The TOML tables ``key`` may be in, each with its name (None for a section)."""
    if key.in_tables:
        tables = document.get(key.section)
        for table in tables if isinstance(tables, list) else []:
            if isinstance(table, dict):
                name = table.get("name")
                yield (name if isinstance(name, str) else None), table
        return
    section = document.get(key.section)
    if section is None:
        section = document[key.section] = {}
    if isinstance(section, dict):
        yield None, section


def _directories(environ: Mapping[str, str]) -> list[tuple[str, Path]]:
    found = []
    credentials = environ.get(CREDENTIALS_ENV)
    if credentials:
        found.append(("systemd credential", Path(credentials)))
    found.append(("secret", Path(environ.get(SECRETS_DIR_ENV) or DEFAULT_SECRETS_DIR)))
    return found


def read_secret_files(
    document: dict[str, Any], settings: type[BaseModel], environ: Mapping[str, str]
) -> dict[str, Any]:
    """``document`` (the TOML file's, as dicts) with every secret found in a file filled in.

    The environment's values are not put in: the settings' own environment source
    reads them, and wins over the document. Raises ``SecretFileError``.
    """
    directories = _directories(environ)
    for key in secret_keys(settings):
        env_file = None if key.in_tables else environ.get(key.env_name + FILE_SUFFIX.upper())
        if env_file is not None and key.env_name in environ:
            raise SecretFileError(f"{key.env_name} and {key.env_name}_FILE are both set")
        for table_name, table in _tables(document, key):
            where = key.file_name(table_name)
            file_key = key.key + FILE_SUFFIX
            if file_key in table:
                if key.key in table:
                    raise SecretFileError(f"{where}: give {key.key} or {file_key}, not both")
                table[key.key] = _read(Path(str(table.pop(file_key))), where, key)
            if env_file is not None:
                table[key.key] = _read(Path(env_file), key.env_name + "_FILE", key)
            if key.key in table or key.env_name in environ or (key.in_tables and not table_name):
                continue
            for kind, directory in directories:
                candidate = directory / where
                if candidate.is_file():
                    table[key.key] = _read(candidate, f"{where} ({kind} {candidate})", key)
                    break
    return document


def file_variables(settings: type[BaseModel]) -> frozenset[str]:
    """The ``BOT_..._FILE`` variables ``read_secret_files`` reads (lower-cased, as the
    settings' environment source sees them): that source must leave them alone."""
    return frozenset(
        (key.env_name + FILE_SUFFIX.upper()).lower()
        for key in secret_keys(settings)
        if not key.in_tables
    )


def scrub_environment(settings: type[BaseModel], environ: MutableMapping[str, str]) -> list[str]:
    """Remove the secrets' variables (values and ``_FILE`` paths) from ``environ``, once
    the settings are loaded: a process started after this does not inherit them. The
    names removed, sorted."""
    names = set()
    for key in secret_keys(settings):
        if not key.in_tables:
            names.update({key.env_name, key.env_name + FILE_SUFFIX.upper()})
    removed = sorted(name for name in environ if name.upper() in names)
    for name in removed:
        del environ[name]
    return removed


def scrub_process_environment(settings: type[BaseModel]) -> list[str]:
    """``scrub_environment`` of this process (``os.environ``)."""
    return scrub_environment(settings, os.environ)
