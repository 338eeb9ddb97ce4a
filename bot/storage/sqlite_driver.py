"""aiosqlite for SQLAlchemy: one trip to aiosqlite's thread per read, none for a write.

SQLAlchemy's aiosqlite adapter makes four trips per statement (open a cursor, execute,
fetch the rows, close the cursor), each waiting for the worker thread and then for an
event-loop iteration. A statement itself takes tens of microseconds, the trips take
milliseconds on a loaded machine, and a writer holds the one SQLite write lock across
all of them. The cursor here runs the whole statement in one function on the thread
and keeps what SQLAlchemy reads afterwards (rows, description, rowcount, lastrowid).

A write transaction makes no trip at all: once it holds SQLite's write lock nothing in
it can wait for another connection (WAL: readers never block a writer), so its
statements, its commit and its rollback run on the calling thread, the event loop's,
in microseconds each. A trip would cost a loop iteration per statement, milliseconds
while the loop streams replies, all of it with the lock held and every other writer
waiting (bot/storage/db.py: ``_on_sqlite_begin`` begins it with ``begin_writing``).
A read-only transaction that asks for it (``begin_reading``: a turn's own small
reads, its claim and its history) runs in place too: in WAL mode a reader does not
wait for writers either, and a trip per statement was most of a turn's start.

Built on SQLAlchemy's adapter classes (sqlalchemy/connectors/asyncio.py,
sqlalchemy/dialects/sqlite/aiosqlite.py) and aiosqlite's ``Connection._execute`` and
``_conn``: not public API, stable at the versions pinned in requirements/constraints.txt
(SQLAlchemy 2.1.9, aiosqlite 0.22.1). tests/test_sqlite_driver.py checks the promises.
"""

from __future__ import annotations

import collections
import sqlite3
from typing import Any

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)
from sqlalchemy.util import EMPTY_DICT, await_only

_Outcome = tuple[Any, int, int | None, list[Any] | None]
"""What one statement leaves behind: description, rowcount, lastrowid, rows."""


def _run_statement(
    conn: sqlite3.Connection, operation: str, parameters: Any, many: bool
) -> _Outcome:
    # Runs on aiosqlite's thread: the cursor lives and dies there, so a statement
    # interrupted by a cancellation leaves no unfinished cursor (and no open read) behind.
    cursor = conn.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        else:
            cursor.execute(operation, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description else None
        return description, cursor.rowcount, cursor.lastrowid, rows
    finally:
        cursor.close()


async def _run_here(
    conn: sqlite3.Connection, operation: str, parameters: Any, many: bool
) -> _Outcome:
    # Awaited, it returns without suspending: no loop iteration, but an await all the
    # same, which SQLAlchemy's AsyncConnection.execute requires of every call.
    return _run_statement(conn, operation, parameters, many)


class OneTripCursor(AsyncAdapt_aiosqlite_cursor):
    """A client-side cursor whose statement is one call on the connection's thread."""

    __slots__ = ("_arraysize", "_description", "_lastrowid", "_rowcount")

    def __init__(self, adapt_connection: AsyncAdapt_aiosqlite_connection) -> None:
        # No aiosqlite cursor (a trip to open it): the statement opens its own.
        self._adapt_connection = adapt_connection
        self._connection = adapt_connection._connection
        self._cursor = None  # type: ignore[assignment]
        self._soft_closed_memoized = EMPTY_DICT
        self._rows = collections.deque()
        self._description: Any = None
        self._rowcount = -1
        self._lastrowid: int | None = None
        self._arraysize = 1

    @property
    def description(self) -> Any:
        return self._description

    @property
    def rowcount(self) -> int:
        return self._rowcount

    @property
    def lastrowid(self) -> int:
        return self._lastrowid  # type: ignore[return-value]

    @property
    def arraysize(self) -> int:
        return self._arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._arraysize = value

    async def _async_soft_close(self) -> None:
        return  # nothing open: the rows are already here

    def close(self) -> None:
        self._rows.clear()

    def execute(self, operation: Any, parameters: Any = None) -> Any:
        return self._run(operation, () if parameters is None else parameters, many=False)

    def executemany(self, operation: Any, seq_of_parameters: Any) -> Any:
        return self._run(operation, seq_of_parameters, many=True)

    def _run(self, operation: Any, parameters: Any, *, many: bool) -> Any:
        adapted: OneTripConnection = self._adapt_connection  # type: ignore[assignment]
        try:
            raw = adapted.in_place_connection()
            if raw is not None:
                outcome = await_only(_run_here(raw, operation, parameters, many))
            else:
                outcome = await_only(self._run_async(operation, parameters, many))
        except Exception as error:
            adapted._handle_exception(error)
        self._description, self._rowcount, self._lastrowid, rows = outcome
        self._rows = collections.deque(rows or ())
        return None

    async def _run_async(self, operation: Any, parameters: Any, many: bool) -> _Outcome:
        connection: aiosqlite.Connection = self._connection  # type: ignore[assignment]
        on_thread: Any = connection._execute  # runs a function on aiosqlite's thread
        async with self._adapt_connection._execute_mutex:
            outcome: _Outcome = await on_thread(
                _run_statement, connection._conn, operation, parameters, many
            )
            return outcome

    def nextset(self) -> None:
        return None  # sqlite3 has one result set per statement

    def setinputsizes(self, *inputsizes: Any) -> None:
        return None  # sqlite3 ignores it too


class OneTripConnection(AsyncAdapt_aiosqlite_connection):
    """aiosqlite's adapted connection with ``OneTripCursor`` for client-side cursors.

    Commit and rollback outside a transaction skip the trip: SQLAlchemy commits after
    the writer queue's own commit (bot/storage/db.py), and the pool rolls back every
    connection it takes back, both mostly with nothing to end. Inside a transaction
    begun in place (``begin_writing``, ``begin_reading``) they run on the calling thread.
    """

    __slots__ = ("_in_place",)

    _cursor_cls = OneTripCursor  # type: ignore[assignment]  # a subclass of the base's

    def __init__(self, dbapi: Any, connection: Any) -> None:
        super().__init__(dbapi, connection)
        self._in_place = False

    def _raw(self) -> sqlite3.Connection | None:
        # sqlite3's connection, used from the loop's thread (aiosqlite opens it with
        # check_same_thread off); nothing of this connection runs on the worker
        # meanwhile: its statements are awaited one after another.
        raw: sqlite3.Connection | None = self._connection._connection
        return raw

    def _in_transaction(self) -> bool:
        raw = self._raw()
        return raw is not None and raw.in_transaction

    def begin_writing(self) -> bool:
        """BEGIN IMMEDIATE here and now if SQLite's write lock is free; False if not.

        The lock is only ever busy when another process holds it (this process's
        writers queue for it first, bot/storage/db.py); the caller then waits for it
        on aiosqlite's thread (``BEGIN IMMEDIATE`` as a statement, under the busy
        timeout) and calls ``writing_begun``. Any other failure also answers False,
        for that statement to raise it the usual way.
        """
        raw = self._raw()
        if raw is None or raw.in_transaction:
            return False
        try:
            # No busy handler for this one attempt: on the loop's thread, a wait
            # for another process would stop every task of this one.
            _, _, _, rows = _run_statement(raw, "PRAGMA busy_timeout", (), many=False)
            busy_timeout_ms = int(rows[0][0]) if rows else 0
            _run_statement(raw, "PRAGMA busy_timeout=0", (), many=False)
            try:
                _run_statement(raw, "BEGIN IMMEDIATE", (), many=False)
            finally:
                restore = f"PRAGMA busy_timeout={busy_timeout_ms}"
                _run_statement(raw, restore, (), many=False)
        except sqlite3.Error:
            if not raw.in_transaction:
                return False
        self._in_place = True
        return True

    def writing_begun(self) -> None:
        """The write transaction began on aiosqlite's thread: the rest runs here."""
        self._in_place = self._in_transaction()

    def begin_reading(self) -> bool:
        """BEGIN DEFERRED here, the transaction's statements then here too; False if not.

        Only for short reads: a statement in place holds up the whole event loop. In
        WAL mode a reader waits for nobody (short of another process recovering the
        database after a crash, or closing its last connection). On False (no
        connection, a failure) the caller begins on aiosqlite's thread as usual.
        """
        raw = self._raw()
        if raw is None or raw.in_transaction:
            return False
        try:
            _run_statement(raw, "BEGIN DEFERRED", (), many=False)
        except sqlite3.Error:
            return False
        self._in_place = True
        return True

    def ends_in_place(self) -> bool:
        """True when ending what is open (commit, rollback: the pool's reset included)
        runs on the calling thread: no transaction, or one begun in place."""
        return not self._in_transaction() or self.in_place_connection() is not None

    def in_place_connection(self) -> sqlite3.Connection | None:
        """sqlite3's connection inside a transaction begun in place, else None."""
        if not self._in_place:
            return None
        raw = self._raw()
        if raw is not None and raw.in_transaction:
            return raw
        # Ended (committed, rolled back, or by SQLite itself on an error): what
        # follows, a long read say, goes to the thread again.
        self._in_place = False
        return None

    def commit(self) -> None:
        raw = self.in_place_connection()
        if raw is not None:
            try:
                raw.commit()
            except Exception as error:
                self._handle_exception(error)
        elif self._in_transaction():
            super().commit()

    def rollback(self) -> None:
        raw = self.in_place_connection()
        if raw is not None:
            try:
                raw.rollback()
            except Exception as error:
                self._handle_exception(error)
        elif self._in_transaction():
            super().rollback()


class OneTripDBAPI(AsyncAdapt_aiosqlite_dbapi):
    """The DBAPI module to give ``create_async_engine(module=...)`` for aiosqlite URLs."""

    def __init__(self) -> None:
        super().__init__(aiosqlite, sqlite3)

    def connect(self, *arg: Any, **kw: Any) -> OneTripConnection:
        adapted = super().connect(*arg, **kw)
        return OneTripConnection(self, adapted._connection)
