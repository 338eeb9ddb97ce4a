"""API keys: ``bot_<prefix>_<secret>``, stored as prefix + SHA-256 of the whole key.

The prefix finds the row; the hash is compared in constant time. A key is
shown once, when it is made, and never stored or logged in clear. A
high-entropy random secret needs no slow password hash: SHA-256 of 256 random
bits cannot be brute-forced.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import secrets
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import structlog
from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.storage.db import storage_unavailable
from bot.storage.models import ApiKey, as_utc, utcnow
from bot.turns.owners import check_key_owner, key_tenant

KEY_PREFIX = "bot"
PREFIX_BYTES = 6
SECRET_BYTES = 32
SCOPES = ("chat", "admin")
# last_used_at is informational; writing it on every request would serialise SQLite writers.
LAST_USED_RESOLUTION = dt.timedelta(minutes=1)
KEY_CHECK_TTL_S = 1.0
"""How long a key found valid is trusted without asking the database again: a revocation
or rotation (possibly by another process) takes effect within this."""
KEYS_REMEMBERED = 10_000
REFRESH_EVERY_S = KEY_CHECK_TTL_S / 2
"""How often ``keep_keys_fresh`` checks the keys in use again, all in one read."""
KEPT_FRESH_FOR_S = 15 * 60.0
"""How long after its last request a key is still checked again in the background: a
person typing in a chat sends a message every few seconds to minutes, each of which
would otherwise wait for its key's lookup (0.6 ms on SQLite, a round trip and a pooled
connection on PostgreSQL) once the second is up."""
REFRESHED_AT_ONCE = 500
"""Keys per background read (the IN list's length)."""


@dataclass(frozen=True)
class IssuedKey:
    key: str
    """The full key: shown to the admin once, never stored."""
    record: ApiKey


@dataclass(frozen=True)
class Principal:
    """Who a request acts for."""

    key_id: str
    owner: str
    """The tenant the key acts for: ``key:{the key's owner}`` (``bot.turns.owners``), a
    namespace of its own that no platform's tenant is in."""
    scopes: frozenset[str]


@dataclass
class _Checked:
    principal: Principal
    expires_at: dt.datetime | None
    checked_at: float
    """``time.monotonic()`` of the database lookup (or its start, in the background)."""
    used_at: float
    """``time.monotonic()`` of the last request that presented the key."""


class _Retry:
    """A lookup's answer when it was cancelled: whoever waited for it looks up itself."""


_RETRY = _Retry()

log = structlog.get_logger(__name__)


@dataclass
class _KnownKeys:
    """What one database's key checks share in this process."""

    checked: OrderedDict[str, _Checked] = field(default_factory=OrderedDict)
    """Keys found valid, by the SHA-256 of the key."""
    lookups: dict[str, asyncio.Future[Principal | _Retry | None]] = field(default_factory=dict)
    """Lookups under way, by the SHA-256 of the key: a request that presents the same
    key meanwhile waits for that answer instead of asking the database again."""


# Per database (its read sessionmaker).
_known: weakref.WeakKeyDictionary[async_sessionmaker[AsyncSession], _KnownKeys] = (
    weakref.WeakKeyDictionary()
)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def split_key(key: str) -> str | None:
    """The prefix of a well-formed key, else None."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


async def create_key(
    session: AsyncSession,
    *,
    name: str,
    owner: str | None = None,
    scopes: tuple[str, ...] = ("chat",),
    expires_at: dt.datetime | None = None,
) -> IssuedKey:
    unknown = set(scopes) - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s): {', '.join(sorted(unknown))}")
    owner = check_key_owner(owner or name)
    prefix = secrets.token_hex(PREFIX_BYTES)
    key = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"
    record = ApiKey(
        name=name,
        owner=owner,
        prefix=prefix,
        secret_hash=hash_key(key),
        scopes=",".join(scopes),
        expires_at=expires_at,
    )
    session.add(record)
    await session.flush()
    return IssuedKey(key, record)


async def authenticate(
    read_sessions: async_sessionmaker[AsyncSession], presented: str
) -> Principal | None:
    """The principal for a presented key, or None (unknown, wrong, revoked or expired).

    The key is looked up in a read-only session: on SQLite that takes no write
    lock, so checking a key never queues behind the turns being written; nor does
    it wait for its ``last_used_at`` to be written (``keep_keys_fresh`` does that,
    to the minute, in the background). A valid key is then trusted for
    ``KEY_CHECK_TTL_S`` without a lookup (its expiry is still checked every time).
    """
    prefix = split_key(presented)
    if prefix is None:
        return None
    # A key checked in the last second is not looked up again: under a burst of messages
    # the lookup would be one more trip to the database for every acknowledgement.
    digest = hash_key(presented)
    known = _known.setdefault(read_sessions, _KnownKeys())
    while True:
        hit = known.checked.get(digest)
        now = time.monotonic()
        if (
            hit is not None
            and now - hit.checked_at < KEY_CHECK_TTL_S
            and (hit.expires_at is None or as_utc(hit.expires_at) > utcnow())
        ):
            hit.used_at = now
            return hit.principal
        # Once the second is up, every request of a burst with that key would look it
        # up at once, each holding a pooled connection meanwhile (on a busy SQLite
        # service that emptied the pool and stalled every ack): one asks, the rest wait.
        pending = known.lookups.get(digest)
        if pending is None:
            return await _look_up(read_sessions, known, prefix, digest)
        # Shielded: a waiter whose client leaves must not cancel the lookup for the others.
        answer = await asyncio.shield(pending)
        if not isinstance(answer, _Retry):
            return answer


async def _look_up(
    read_sessions: async_sessionmaker[AsyncSession],
    known: _KnownKeys,
    prefix: str,
    digest: str,
) -> Principal | None:
    """Look the key up, with its answer shared with the requests that wait for it."""
    answer: asyncio.Future[Principal | _Retry | None] = asyncio.get_running_loop().create_future()
    known.lookups[digest] = answer
    try:
        principal = await _check_stored(read_sessions, known, prefix, digest)
    except Exception as exc:
        answer.set_exception(exc)
        answer.exception()  # seen: nobody may be waiting to retrieve it
        raise
    except BaseException:
        answer.set_result(_RETRY)  # cancelled: the waiters are not, and look it up themselves
        raise
    else:
        answer.set_result(principal)
        return principal
    finally:
        del known.lookups[digest]


async def _check_stored(
    read_sessions: async_sessionmaker[AsyncSession],
    known: _KnownKeys,
    prefix: str,
    digest: str,
) -> Principal | None:
    looked_up_at = time.monotonic()
    async with read_sessions() as session:
        query = select(ApiKey).where(ApiKey.prefix == prefix)
        record = (await session.scalars(query)).one_or_none()
    # Hash even when the prefix is unknown, so timing does not tell which prefixes exist.
    expected = record.secret_hash if record is not None else hash_key("")
    if not hmac.compare_digest(digest, expected) or record is None:
        return None
    now = utcnow()
    if record.revoked_at is not None:
        return None
    if record.expires_at is not None and as_utc(record.expires_at) <= now:
        return None
    # Its use is noted by the next refresh (``keep_keys_fresh``, within half a second), not
    # here: a key's first request would wait for a write (SQLite's lock, a transaction).
    principal = _principal(record.id, record.owner, record.scopes)
    known.checked[digest] = _Checked(principal, record.expires_at, looked_up_at, looked_up_at)
    while len(known.checked) > KEYS_REMEMBERED:
        known.checked.popitem(last=False)
    return principal


def _principal(key_id: str, owner: str, scopes: str) -> Principal:
    return Principal(key_id, key_tenant(owner), frozenset(scopes.split(",")))


_NOTE_USE = (
    update(ApiKey.__table__)  # type: ignore[arg-type]  # a Table: one executemany
    .where(ApiKey.__table__.c.id == bindparam("key_id"))
    .values(last_used_at=bindparam("when"))
)


async def _note_use(
    sessions: async_sessionmaker[AsyncSession], used: dict[str, dt.datetime]
) -> None:
    """Write keys' ``last_used_at`` (informational, to the minute: a short write)."""
    async with sessions() as session, session.begin():
        await session.execute(
            _NOTE_USE, [{"key_id": key_id, "when": when} for key_id, when in used.items()]
        )


async def rehearse_key_check(read_sessions: async_sessionmaker[AsyncSession]) -> None:
    """A key's check, its statement and all, for a key no one has: nothing found
    (``bot.warm_up``). The first request of a process otherwise compiles it."""
    prefix = secrets.token_hex(PREFIX_BYTES)
    known = _KnownKeys()  # not the process's: nothing of this is remembered
    found = await _check_stored(read_sessions, known, prefix, hash_key(prefix))
    if found is not None:
        raise RuntimeError("a made-up key was found")


REFRESH_RETRY_MAX_S = 8.0
"""The longest pause between refreshes while they fail (the database is away)."""


async def keep_keys_fresh(
    read_sessions: async_sessionmaker[AsyncSession],
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Check the keys in use again every ``REFRESH_EVERY_S``, so that their requests find
    them checked (``authenticate``); runs until cancelled (the app's lifetime).

    A key presented in the last ``KEPT_FRESH_FOR_S`` is read again with the others in
    one statement; one revoked, expired, rotated or deleted meanwhile is forgotten, and
    its next request looks it up and is refused. A failed read changes nothing: the keys
    then age out and their requests look them up, as without this; the refreshes back
    off while they fail. Revocation takes effect within ``KEY_CHECK_TTL_S`` either way.
    """
    known = _known.setdefault(read_sessions, _KnownKeys())
    loop = asyncio.get_running_loop()
    failures = 0
    due = loop.time()
    while True:
        # On a fixed beat, not a pause after each refresh: a slow one (a write waiting
        # for SQLite's lock) must not let the keys in use lapse.
        due = max(due + REFRESH_EVERY_S, loop.time())
        if failures:
            due += min(REFRESH_RETRY_MAX_S, REFRESH_EVERY_S * 2**failures)
        await asyncio.sleep(due - loop.time())
        try:
            await _refresh(read_sessions, sessions, known)
        except Exception as exc:
            if not failures:  # once, not every half second while the database is away
                if storage_unavailable(exc):
                    log.warning("key_refresh_failed", error=type(exc).__name__)
                else:
                    log.exception("key_refresh_failed")
            failures += 1
        else:
            if failures:
                log.info("key_refresh_recovered", failed=failures)
            failures = 0


_REFRESHED_COLUMNS = (
    ApiKey.id,
    ApiKey.owner,
    ApiKey.scopes,
    ApiKey.secret_hash,
    ApiKey.revoked_at,
    ApiKey.expires_at,
    ApiKey.last_used_at,
)


async def _refresh(
    read_sessions: async_sessionmaker[AsyncSession],
    sessions: async_sessionmaker[AsyncSession],
    known: _KnownKeys,
) -> None:
    started = time.monotonic()
    # The keys in use, by id.
    by_id = {
        checked.principal.key_id: digest
        for digest, checked in known.checked.items()
        if started - checked.used_at < KEPT_FRESH_FOR_S
    }
    ids = list(by_id)
    for chunk in (ids[i : i + REFRESHED_AT_ONCE] for i in range(0, len(ids), REFRESHED_AT_ONCE)):
        async with read_sessions() as session:
            # Columns, not entities: this runs on the loop's thread on SQLite (in place).
            rows = await session.execute(select(*_REFRESHED_COLUMNS).where(ApiKey.id.in_(chunk)))
            records = {row.id: row for row in rows}
        now = utcnow()
        used: dict[str, dt.datetime] = {}
        for key_id in chunk:
            digest = by_id[key_id]
            record = records.get(key_id)
            if record is None or not (
                hmac.compare_digest(digest, record.secret_hash)
                and record.revoked_at is None
                and (record.expires_at is None or as_utc(record.expires_at) > now)
            ):
                known.checked.pop(digest, None)  # its next request is looked up, and refused
                continue
            checked = known.checked.get(digest)
            if checked is None:
                continue  # forgotten meanwhile (pushed out by newer keys)
            checked.principal = _principal(record.id, record.owner, record.scopes)
            checked.expires_at = record.expires_at
            checked.checked_at = max(checked.checked_at, started)
            # The requests that would have written it found the key checked here.
            presented_at = now - dt.timedelta(seconds=time.monotonic() - checked.used_at)
            stored = record.last_used_at
            if stored is None or presented_at - as_utc(stored) > LAST_USED_RESOLUTION:
                used[key_id] = presented_at
        if used:
            await _note_use(sessions, used)
