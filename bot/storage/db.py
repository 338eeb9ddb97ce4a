"""The async database engine and session factory (SQLite by default, PostgreSQL in production)."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy.exc
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import NullPool, PoolResetState
from sqlalchemy.util import await_only
from sqlalchemy.util.concurrency import in_greenlet

from bot.ops.recent_answer import RecentAnswer
from bot.storage.sqlite_driver import OneTripConnection, OneTripDBAPI

SQLITE_BUSY_TIMEOUT_MS = 5000
READ_ONLY = "bot_read_only"
"""Execution option of the read-only sessions (``create_read_sessionmaker``)."""
IN_PLACE = "bot_in_place"
"""Execution option of read-only sessions whose short reads run on the loop's thread."""


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets SSE readers run while a turn writes; foreign keys are off by default in SQLite.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL syncs at checkpoints, not at every commit: a commit stays atomic
    # and the database uncorrupted; a power cut may lose the last commits, a crash of
    # the process none. Every accept is a commit, so this is the ack's largest cost.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()
    # Let SQLAlchemy's "begin" event issue BEGIN itself (below) instead of the driver.
    dbapi_connection.isolation_level = None


_WRITER_HELD = "bot_writer_lock"
"""Key in a pooled connection's ``info``: the place in the writer queue it holds."""

_writer_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _writer_lock(database: str) -> asyncio.Lock:
    """The lock the writers to ``database`` queue on in this process (one per event loop)."""
    locks = _writer_locks.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault(database, asyncio.Lock())


@dataclass(frozen=True)
class _WriterPlace:
    """A connection's place at the head of the writer queue: the lock and its loop."""

    lock: asyncio.Lock
    loop: asyncio.AbstractEventLoop


async def _acquire_within(lock: asyncio.Lock, timeout_s: float) -> bool:
    # Not wait_for: it wraps the acquire in a task of its own, a trip through the event
    # loop for every write even when the lock is free (then this does not suspend at all).
    try:
        async with asyncio.timeout(timeout_s):
            await lock.acquire()
    except TimeoutError:
        return False
    return True


def _release_writer(info: dict[str, Any] | None) -> None:
    # Popping the place makes each acquisition released once, and only by the
    # connection that took it: a connection that holds none has nothing to pop.
    place = info.pop(_WRITER_HELD, None) if info is not None else None
    if place is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is place.loop:
        place.lock.release()
        return
    # An asyncio lock is not thread-safe: a release from elsewhere (the garbage
    # collector finalizing a connection dropped unclosed runs in whatever thread
    # it interrupts) is handed to the lock's own loop. If that loop is closed, nobody
    # waits on its lock any more.
    with contextlib.suppress(RuntimeError):
        place.loop.call_soon_threadsafe(place.lock.release)


def _on_sqlite_begin(connection: Any) -> None:
    # A deferred transaction that reads and then writes cannot wait for the write lock:
    # if another connection committed meanwhile, SQLite fails it at once with "database
    # is locked" (the busy timeout does not apply). Taking the lock at BEGIN makes every
    # transaction that may write queue on busy_timeout instead.
    # Sessions that only read (READ_ONLY) begin deferred: in WAL mode they never take the
    # write lock, so a slow reader (an export piped into a slow consumer, a history load)
    # cannot hold up the turns' writes, and they do not wait for them either.
    options = connection.get_execution_options()
    if options.get(READ_ONLY):
        driver = connection.connection.dbapi_connection
        in_place = options.get(IN_PLACE) and isinstance(driver, OneTripConnection)
        if not (in_place and driver.begin_reading()):
            connection.exec_driver_sql("BEGIN DEFERRED")
        return
    # The writers of this process queue on an asyncio lock (first come, first served)
    # before they ask SQLite: SQLite's own busy handler polls with sleeps growing to
    # 100 ms, so under a burst of accepts a writer would often sleep long after the lock
    # was free. Past the busy timeout (a writer that never let go) SQLite decides.
    info = connection.connection.info
    if _WRITER_HELD not in info:
        database = connection.engine.url.database or ":memory:"
        lock = _writer_lock(database)
        if await_only(_acquire_within(lock, SQLITE_BUSY_TIMEOUT_MS / 1000)):
            info[_WRITER_HELD] = _WriterPlace(lock, asyncio.get_running_loop())
    # Once it holds SQLite's lock, the transaction runs on this thread, with no trip to
    # aiosqlite's (sqlite_driver.py): the lock is held microseconds, not loop iterations.
    driver = connection.connection.dbapi_connection
    try:
        if isinstance(driver, OneTripConnection):
            if not driver.begin_writing():
                connection.exec_driver_sql("BEGIN IMMEDIATE")  # another process's turn first
                driver.writing_begun()
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
    except BaseException:
        _release_writer(info)
        raise


def _held_place(connection: Any) -> dict[str, Any] | None:
    """The ``info`` of ``connection``'s pooled connection if it holds a writer place."""
    # An invalidated connection (a statement interrupted by a cancellation, a lost
    # connection) has no pooled connection to ask: reading ``connection.connection``
    # would raise, and an exception from a listener of the rollback that follows would
    # replace the one being handled (a cancellation would turn into PendingRollbackError).
    # Its place is given back when the pool takes it back (``_on_sqlite_checkin``).
    if connection.invalidated or connection.closed:
        return None
    info: dict[str, Any] = connection.connection.info
    return info if _WRITER_HELD in info else None


def _on_sqlite_commit(connection: Any) -> None:
    # This event comes before SQLAlchemy's COMMIT; the lock may only go once the
    # transaction has ended, so commit here (SQLAlchemy's COMMIT is then a no-op: the
    # driver commits only inside a transaction). A failure is left to SQLAlchemy's own
    # COMMIT, which raises it as usual, and to the rollback that follows.
    info = _held_place(connection)
    if info is None:
        return
    try:
        connection.connection.dbapi_connection.commit()
    except Exception:
        return
    _release_writer(info)


def _on_sqlite_rollback(connection: Any) -> None:
    info = _held_place(connection)
    if info is None:
        return
    try:
        connection.connection.dbapi_connection.rollback()
    except Exception:
        return  # the pool's own reset rolls back or closes it, then checks it in
    _release_writer(info)


def _on_sqlite_checkin(_dbapi_connection: Any, record: Any) -> None:
    # Back in the pool, a connection holds no transaction any more: the pool has rolled
    # it back, or closed it (an invalidated connection), before this event.
    _release_writer(record.info)


def _on_sqlite_reset(_dbapi_connection: Any, record: Any, state: PoolResetState) -> None:
    # Only a connection the garbage collector found unclosed: the pool can neither roll
    # it back nor check it in from there (no "checkin" follows), it terminates it. Any
    # other reset comes before the pool's rollback, and "checkin" after it.
    if not state.asyncio_safe:
        _release_writer(record.info)


def _on_sqlite_invalidate(dbapi_connection: Any, record: Any, _error: Any) -> None:
    # A writer invalidated mid-transaction (its statement interrupted by a cancellation)
    # is closed next, and SQLite defers closing a connection whose statement is not
    # finalized yet (the interrupted cursor lives on in the traceback): its transaction,
    # and SQLite's write lock, would outlive the close until the garbage collector found
    # that cursor, and the next writer would wait the busy timeout out and fail. Rolled
    # back first, the transaction ends now. Its place in the queue goes at the checkin
    # that follows the close. (Only where the driver can be awaited: the garbage
    # collector's cleanup terminates the connection anyway.)
    if _WRITER_HELD in record.info and in_greenlet():
        with contextlib.suppress(Exception):
            dbapi_connection.rollback()


def new_async_engine(url: str | URL, **options: Any) -> AsyncEngine:
    """``create_async_engine`` as every engine of the service has it: no user text in errors.

    A failed statement's error, and so its log line and traceback, would quote the
    statement's parameters (a message's text) unless ``hide_parameters``; and
    PostgreSQL's DETAIL quotes the refused row or key ("Failing row contains (...)",
    "Key (...)=(...) already exists"), which asyncpg's exception text repeats: it is
    dropped as the error is raised (``_without_row_detail``).
    """
    engine = create_async_engine(url, hide_parameters=True, **options)
    event.listen(engine.sync_engine, "handle_error", _without_row_detail)
    return engine


def _without_row_detail(context: Any) -> None:
    seen: set[int] = set()
    error: BaseException | None = context.original_exception
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        # asyncpg's PostgresMessage: its text adds ``detail`` (the row, the key) and ``hint``.
        # Only the server's text: SQLAlchemy's own errors keep a list under that name.
        if isinstance(getattr(error, "detail", None), str):
            with contextlib.suppress(AttributeError, TypeError):
                error.detail = None  # type: ignore[attr-defined]
        error = error.__cause__ or error.__context__


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_engine(url: str, *, echo: bool = False, **pool: int) -> AsyncEngine:
    """Create the engine; for SQLite, create the database's folder and set its pragmas.

    ``pool``: ``pool_size`` and ``max_overflow`` of a PostgreSQL engine's pool
    (SQLAlchemy's defaults, 5 and 10, if not given); SQLite's engine ignores them.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # aiosqlite's own adapter makes four trips to its thread per statement, each
        # while a writer holds the write lock; this one makes one (sqlite_driver.py).
        module = OneTripDBAPI() if parsed.get_driver_name() == "aiosqlite" else None
        engine = new_async_engine(url, echo=echo, module=module)
        event.listen(engine.sync_engine, "connect", _on_sqlite_connect)
        event.listen(engine.sync_engine, "begin", _on_sqlite_begin)
        event.listen(engine.sync_engine, "commit", _on_sqlite_commit)
        event.listen(engine.sync_engine, "rollback", _on_sqlite_rollback)
        # A connection gives its writer place back at "checkin", once its transaction has
        # ended: not at "reset" nor "invalidate", which come before the pool's rollback
        # or close; nor at "soft_invalidate", after which its transaction goes on.
        event.listen(engine.sync_engine.pool, "checkin", _on_sqlite_checkin)
        event.listen(engine.sync_engine.pool, "reset", _on_sqlite_reset)
        event.listen(engine.sync_engine.pool, "invalidate", _on_sqlite_invalidate)
        return engine
    return _checked_at_checkout(new_async_engine(url, echo=echo, **pool))


SERVICE_POOL = {"pool_size": 10, "max_overflow": 0}
"""Each of the service's two PostgreSQL pools: up to 10 connections, opened as needed and
kept. No overflow: an overflow connection is closed at its checkin and opened again at the
next burst, each open several round trips on a loop that is busy just then."""


@dataclass(frozen=True)
class ServiceEngines:
    """The service's database engines: its request handlers' and its turns' work.

    On PostgreSQL each has a pool of its own. The requests' (accepts, key checks,
    readers of a turn, reports) wait for a connection only behind other requests;
    with one shared pool, the work of the turns their own acks had started (claims,
    starts, history reads, saves of replies so far, final writes) held its 15
    connections and an ack waited up to 0.7 s for one (``bench/load.py`` on PostgreSQL
    at 100 messages/s with SmolLM2). On SQLite both are one engine: a file needs no
    pool, and the process's one writer queue orders all of its writes.
    """

    requests: AsyncEngine
    turns: AsyncEngine

    @property
    def distinct(self) -> tuple[AsyncEngine, ...]:
        """Each engine once (SQLite's two are one)."""
        return tuple(dict.fromkeys((self.requests, self.turns)))

    async def open_pools(self) -> int:
        """PostgreSQL: open each pool's connections now (``SERVICE_POOL``), all of them.

        Opened as needed, a burst of messages right after a start (a restart under
        traffic) opened them all at once, each a new server process and several round
        trips, while its acks waited (``bench/load.py``'s first second). SQLite's one
        engine keeps no pool to fill.

        Returns how many connections each engine now has open to spread work over (the
        warm-up's rehearsals): a pool's size, or SQLite's one.
        """
        opened = 1
        for engine in self.distinct:
            if engine.dialect.name == "sqlite":
                continue
            opened = SERVICE_POOL["pool_size"]
            async with contextlib.AsyncExitStack() as held:
                # Held together: each checkout takes a connection of its own.
                await asyncio.gather(
                    *(
                        held.enter_async_context(engine.connect())
                        for _ in range(SERVICE_POOL["pool_size"])
                    )
                )
        return opened

    async def dispose(self) -> None:
        for engine in self.distinct:
            await engine.dispose()


def create_service_engines(url: str, *, echo: bool = False) -> ServiceEngines:
    """The engines of a serving process (``ServiceEngines``)."""
    turns = create_engine(url, echo=echo, **SERVICE_POOL)
    if turns.dialect.name == "sqlite":
        return ServiceEngines(requests=turns, turns=turns)
    return ServiceEngines(requests=create_engine(url, echo=echo, **SERVICE_POOL), turns=turns)


def _checked_at_checkout(engine: AsyncEngine) -> AsyncEngine:
    """``engine`` (PostgreSQL) with every pooled connection pinged as it is checked out."""
    event.listen(engine.sync_engine, "connect", _on_server_connect)
    event.listen(engine.sync_engine.pool, "checkout", _ping_on_checkout)
    return engine


_FRESH = "bot_fresh"
"""Key in a pooled connection's ``info``: opened for this checkout, nothing to ping yet."""


def _on_server_connect(_dbapi_connection: Any, record: Any) -> None:
    record.info[_FRESH] = True


def _ping_on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """SQLAlchemy's ``pool_pre_ping``, in one round trip instead of three.

    Every session checks a connection out, and a connection the server has closed
    since (a restart, a cut) must not fail the session's first statement. The
    pre-ping of SQLAlchemy's asyncpg dialect wraps its ";" in BEGIN and ROLLBACK
    (SQLAlchemy's choice for pgbouncer's transaction mode,
    https://github.com/sqlalchemy/sqlalchemy/issues/10226): three
    trips on every checkout, each a wait for the database server and for the event
    loop on a busy machine (an accept's trips: docs/scaling.md). Here it is the ";"
    alone. As with the pre-ping, a
    connection opened for this very checkout is not pinged, and a failed ping
    discards every pooled connection older than now (they most likely share the
    restart) and the pool checks out a new one.
    """
    if record.info.pop(_FRESH, False):
        return
    try:
        dbapi_connection.run_async(lambda connection: connection.fetchrow(";"))
    except Exception as exc:
        raise sqlalchemy.exc.InvalidatePoolError(f"ping failed: {type(exc).__name__}") from exc


def watch_answers(*engines: AsyncEngine) -> RecentAnswer:
    """When a statement of one of ``engines`` last completed: readiness's evidence that
    the database answers, without a round trip of its own (``bot.ops.recent_answer``)."""
    answers = RecentAnswer()

    def _answered(*_: Any) -> None:
        answers.saw()

    # After the statement, not at commit: SQLAlchemy's "commit" event comes before the
    # server has said yes.
    for engine in engines:
        event.listen(engine.sync_engine, "after_cursor_execute", _answered)
    return answers


def create_probe_engine(url: str, *, one_round_trip: bool = False) -> AsyncEngine:
    """An engine of its own, for health checks: never the request pool's connections.

    It answers whether the database does, not whether the request pool has a free
    connection: under a burst of requests a pooled check would wait behind them and
    report the service not ready (a load balancer would then take load off a healthy
    worker and pile it on the others). On PostgreSQL it keeps its one connection,
    pinged at checkout like the request pool's: a new one per check cost a server
    process each time and, with the event loop busy, several slow round trips (3 s and
    "not answering" with 150 replies streaming). SQLite opens a file: no pool.

    ``one_round_trip`` (PostgreSQL): no ping and no transaction, so that a check's
    statement is its only trip to the server instead of four (the ping, then BEGIN,
    the statement and ROLLBACK), each of which waits its turn on a
    busy event loop. A connection the server closed since the last check fails the
    statement instead of the ping: callers try once more (``connection_invalidated``).
    """
    if is_sqlite(url):
        return new_async_engine(url, poolclass=NullPool)
    if one_round_trip:
        return new_async_engine(url, pool_size=1, max_overflow=1, isolation_level="AUTOCOMMIT")
    return _checked_at_checkout(new_async_engine(url, pool_size=1, max_overflow=1))


class PromptSession(AsyncSession):
    """An ``AsyncSession`` that gives its connection back as its ``async with`` ends.

    SQLAlchemy closes a session at the end of ``async with`` in a task of its own, so
    that a cancellation cannot abandon the close halfway: the connection goes back to
    the pool only when that task's turn comes, an event-loop iteration later, and the
    caller resumes one more iteration after that. On a busy loop that is tens of
    milliseconds per session, each holding a pooled connection it no longer uses
    (SQLite at 50 messages/s: the turns' history and claim reads held theirs 27-49 ms
    on average, and the acks waited up to seconds for a free one). When the close
    cannot wait for anything (no transaction left, or SQLite transactions that end on
    this thread), nothing can cancel it halfway: it is closed here and now.
    """

    async def __aexit__(self, type_: Any, value: Any, traceback: Any) -> None:
        if self._closes_without_waiting():
            await self.close()
        else:
            await super().__aexit__(type_, value, traceback)

    def _closes_without_waiting(self) -> bool:
        transaction = self.sync_session.get_transaction()
        if transaction is None:
            return True
        for connection in transaction.connections:
            if connection.closed or connection.invalidated:
                return False  # closing it may mean a trip to the driver
            driver = connection.connection.dbapi_connection
            if not (isinstance(driver, OneTripConnection) and driver.ends_in_place()):
                return False
        return True


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, class_=PromptSession, expire_on_commit=False)


def create_read_sessionmaker(
    engine: AsyncEngine, *, in_place: bool = False
) -> async_sessionmaker[AsyncSession]:
    """Sessions for code that only reads: on SQLite they never take the write lock.

    Writing in one of them can fail at once with "database is locked" instead of
    waiting its turn (see ``_on_sqlite_begin``): use ``create_sessionmaker`` to write.
    ``in_place``: on SQLite the statements run on the event loop's thread, without a
    trip to aiosqlite's (bot/storage/sqlite_driver.py); for a turn's own short reads
    only, never for one that may take long (an export, a report).
    """
    options: dict[str, Any] = {READ_ONLY: True, IN_PLACE: in_place}
    if engine.dialect.name == "postgresql":
        # Under READ COMMITTED (PostgreSQL's default, which the turns' locking assumes)
        # every statement reads a snapshot of its own, in a transaction or not: a read
        # session's BEGIN and ROLLBACK are two round trips (a turn's history read: four
        # instead of two) that buy it nothing.
        options["isolation_level"] = "AUTOCOMMIT"
    return async_sessionmaker(
        engine.execution_options(**options), class_=PromptSession, expire_on_commit=False
    )


def create_statement_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """PostgreSQL: sessions whose statements each commit on their own, no transaction.

    For writes that are one statement, all or nothing by itself (an accept's
    ``place_turn``, a claim of a free head, a save of a reply so far): the checkout's
    ping and the statement, where a transaction adds BEGIN and COMMIT, two round trips
    that each wake the database's process on a busy host (docs/performance.md, "What costs
    what"). PostgreSQL only: SQLite's writes queue for its write lock at BEGIN.
    """
    if engine.dialect.name != "postgresql":
        raise ValueError("statements outside a transaction: PostgreSQL only")
    return async_sessionmaker(
        engine.execution_options(isolation_level="AUTOCOMMIT"),
        class_=PromptSession,
        expire_on_commit=False,
    )


_UNAVAILABLE_SIGNS = (
    "database is locked",
    "connection",
    "could not connect",
    "terminating",
    "the database system is",
)


def storage_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database did not answer (try again later), not that a
    statement was wrong: lost or refused connections, an empty pool, a lock held too long."""
    if isinstance(exc, sqlalchemy.exc.TimeoutError | sqlalchemy.exc.DisconnectionError):
        return True  # no pooled connection in time; a connection found dead
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if not isinstance(exc, sqlalchemy.exc.DBAPIError):
        return False
    if exc.connection_invalidated or isinstance(exc.orig, OSError | TimeoutError):
        return True
    if not isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return False
    text = str(exc.orig).lower()
    return any(sign in text for sign in _UNAVAILABLE_SIGNS)
