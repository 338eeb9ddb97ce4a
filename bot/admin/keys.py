"""Key administration: list, revoke and rotate API keys (``botctl keys ...``).

A key is named on the command line by its prefix (``bot_<prefix>_...``, shown
by ``keys list``), its id, or its name when that name is unique among live
keys. Only metadata is ever read back: the secret exists in clear only at
creation.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from bot.apikeys import IssuedKey, create_key
from bot.storage.models import ApiKey, as_utc, utcnow


class KeyNotFound(LookupError):
    pass


class AmbiguousKey(LookupError):
    pass


class DuplicateKeyName(ValueError):
    """A live key already has the name: names are how people tell keys apart (and revoke)."""


@dataclass(frozen=True)
class KeyInfo:
    id: str
    name: str
    owner: str
    prefix: str
    scopes: tuple[str, ...]
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None

    @property
    def state(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and as_utc(self.expires_at) <= utcnow():
            return "expired"
        return "active"


def _info(record: ApiKey) -> KeyInfo:
    return KeyInfo(
        id=record.id,
        name=record.name,
        owner=record.owner,
        prefix=record.prefix,
        scopes=tuple(scope for scope in record.scopes.split(",") if scope),
        created_at=record.created_at,
        last_used_at=record.last_used_at,
        expires_at=record.expires_at,
        revoked_at=record.revoked_at,
    )


async def issue_key(
    session: AsyncSession,
    *,
    name: str,
    owner: str | None,
    scopes: Sequence[str],
    expires_in: dt.timedelta | None,
    allow_duplicate: bool = False,
) -> IssuedKey:
    """A new key; ``DuplicateKeyName`` when a live key has the name (unless allowed)."""
    if not allow_duplicate:
        live = [
            row
            for row in (await session.scalars(select(ApiKey).where(ApiKey.name == name))).all()
            if _info(row).state == "active"
        ]
        if live:
            prefixes = ", ".join(row.prefix for row in live)
            raise DuplicateKeyName(
                f"a live key is already named {name!r} (prefix {prefixes}): choose another "
                "name, or pass --allow-duplicate"
            )
    expires_at = utcnow() + expires_in if expires_in is not None else None
    return await create_key(
        session, name=name, owner=owner, scopes=tuple(scopes), expires_at=expires_at
    )


async def list_keys(session: AsyncSession, *, include_inactive: bool = True) -> list[KeyInfo]:
    rows = (await session.scalars(select(ApiKey).order_by(ApiKey.created_at))).all()
    infos = [_info(row) for row in rows]
    return infos if include_inactive else [info for info in infos if info.state == "active"]


async def find_key(session: AsyncSession, ref: str) -> ApiKey:
    """The key named by prefix, id, a full key's prefix, or a unique live name."""
    parts = ref.split("_")
    prefix = parts[1] if len(parts) >= 3 and parts[0] == "bot" else ref
    rows = (
        await session.scalars(
            select(ApiKey).where(or_(ApiKey.prefix == prefix, ApiKey.id == ref, ApiKey.name == ref))
        )
    ).all()
    exact = [row for row in rows if row.prefix == prefix or row.id == ref]
    if exact:
        return exact[0]
    live = [row for row in rows if row.revoked_at is None]
    if not live:
        raise KeyNotFound(f"no key with prefix, id or name {ref!r}")
    if len(live) > 1:
        prefixes = ", ".join(row.prefix for row in live)
        raise AmbiguousKey(f"{len(live)} live keys are named {ref!r}; give a prefix: {prefixes}")
    return live[0]


async def revoke_key(session: AsyncSession, ref: str) -> KeyInfo:
    """Revoke at once: the next request with this key gets 401. Revoking twice is a no-op."""
    record = await find_key(session, ref)
    if record.revoked_at is None:
        record.revoked_at = utcnow()
    return _info(record)


async def rotate_key(
    session: AsyncSession, ref: str, *, overlap: dt.timedelta | None = None
) -> tuple[KeyInfo, IssuedKey]:
    """Issue a successor with the same name, owner, scopes and lifetime; retire the old key.

    With ``overlap`` the old key keeps working that long (so clients can switch
    over without a gap), else it is revoked at once.
    """
    old = await find_key(session, ref)
    if old.revoked_at is not None:
        raise KeyNotFound(f"key {old.prefix} is revoked; create a new one instead")
    now = utcnow()
    lifetime = as_utc(old.expires_at) - as_utc(old.created_at) if old.expires_at else None
    issued = await issue_key(
        session,
        name=old.name,
        owner=old.owner,
        scopes=[scope for scope in old.scopes.split(",") if scope],
        expires_in=lifetime,
        allow_duplicate=True,  # the successor takes the name over
    )
    if overlap:
        retire_at = now + overlap
        if old.expires_at is None or as_utc(old.expires_at) > retire_at:
            old.expires_at = retire_at
    else:
        old.revoked_at = now
    return _info(old), issued
