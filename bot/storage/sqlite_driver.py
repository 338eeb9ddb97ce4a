"""aiosqlite for SQLAlchemy with one trip to aiosqlite's thread per statement.

SQLAlchemy's aiosqlite adapter makes four trips per statement (open a cursor, execute,
fetch the rows, close the cursor), each waiting for the worker thread and then for an
event-loop iteration. A statement itself takes tens of microseconds, the trips take
milliseconds on a loaded machine, and a writer holds the one SQLite write lock across
all of them. The cursor here runs the whole statement in one function on the thread
and keeps what SQLAlchemy reads afterwards (rows, description, rowcount, lastrowid).

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
        try:
            outcome = await_only(self._run_async(operation, parameters, many))
        except Exception as error:
            self._adapt_connection._handle_exception(error)
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
    connection it takes back, both mostly with nothing to end.
    """

    __slots__ = ()

    _cursor_cls = OneTripCursor  # type: ignore[assignment]  # a subclass of the base's

    def _in_transaction(self) -> bool:
        # A read of sqlite3's autocommit flag from the loop's thread (aiosqlite opens
        # its connections with check_same_thread off); nothing of this connection runs
        # on the worker meanwhile, its statements are awaited one after another.
        raw: sqlite3.Connection | None = self._connection._connection
        return raw is not None and raw.in_transaction

    def commit(self) -> None:
        if self._in_transaction():
            super().commit()

    def rollback(self) -> None:
        if self._in_transaction():
            super().rollback()


class OneTripDBAPI(AsyncAdapt_aiosqlite_dbapi):
    """The DBAPI module to give ``create_async_engine(module=...)`` for aiosqlite URLs."""

    def __init__(self) -> None:
        super().__init__(aiosqlite, sqlite3)

    def connect(self, *arg: Any, **kw: Any) -> OneTripConnection:
        adapted = super().connect(*arg, **kw)
        return OneTripConnection(self, adapted._connection)
