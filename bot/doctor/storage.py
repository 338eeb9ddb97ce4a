"""Doctor checks of the database layer: reachable, and at the newest migration."""

from __future__ import annotations

import asyncio
import socket

from sqlalchemy import text

from bot.config import Settings
from bot.errors import CONFIG, PENDING_MIGRATION, DoctorFailure, ErrorClass
from bot.storage.db import create_engine
from bot.storage.migrate import current_revision, head_revision
from bot.storage.redact import hide_password, redact

DB_TIMEOUT_S = 5.0


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
        orig = getattr(seen[-1], "orig", None)
        if isinstance(orig, BaseException) and orig not in seen:
            current = orig
    return seen


def classify_db_error(exc: BaseException, url: str) -> DoctorFailure:
    """Name the usual cause of a failed connection; never echo the URL (it may hold a password)."""
    where = hide_password(url)
    chain = _chain(exc)
    names = {type(item).__name__ for item in chain}
    text_all = " ".join(str(item) for item in chain).lower()
    if any(isinstance(item, TimeoutError) for item in chain):
        return DoctorFailure(
            ErrorClass.TIMEOUT.value,
            f"no answer from {where} within {DB_TIMEOUT_S:.0f} s",
            "a firewall drops the packets, or the server is overloaded",
        )
    if (
        names & {"InvalidPasswordError", "InvalidAuthorizationSpecificationError"}
        or "password authentication failed" in text_all
        or ("role" in text_all and "does not exist" in text_all)
    ):
        return DoctorFailure(
            ErrorClass.AUTH.value,
            f"{where} refused the credentials",
            "check the user and password in database.url (BOT_DATABASE__URL)",
        )
    if "InvalidCatalogNameError" in names or "does not exist" in text_all:
        return DoctorFailure(
            CONFIG,
            f"{where}: the database does not exist",
            "create it (createdb) or fix the database name in database.url",
        )
    if "unable to open database file" in text_all:
        return DoctorFailure(
            CONFIG,
            f"{where}: cannot open the SQLite file",
            "the folder must exist and be writable by the service user",
        )
    if any(isinstance(item, (ConnectionError, socket.gaierror, OSError)) for item in chain):
        return DoctorFailure(
            ErrorClass.NETWORK.value,
            f"cannot connect to {where} ({type(chain[-1]).__name__})",
            "is the database server running, and are host and port in database.url right?",
        )
    return DoctorFailure(
        ErrorClass.INTERNAL.value, redact(f"{where}: {type(exc).__name__}: {str(exc)[:200]}", url)
    )


async def check_database(settings: Settings) -> str:
    url = settings.database.url
    engine = create_engine(url)
    try:
        async with asyncio.timeout(DB_TIMEOUT_S), engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except Exception as exc:
        raise classify_db_error(exc, url) from exc
    finally:
        await engine.dispose()
    return hide_password(url)


async def check_migrations(settings: Settings) -> str:
    url = settings.database.url
    current = await current_revision(url)
    head = await asyncio.to_thread(head_revision, url)
    if current != head:
        raise DoctorFailure(
            PENDING_MIGRATION,
            f"database at {current or '(empty)'}, newest revision is {head}",
            "run `botctl db upgrade` (serve refuses to start until then)",
        )
    return f"at {head}"
