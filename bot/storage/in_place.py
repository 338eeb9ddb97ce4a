"""Statements run in place: straight on sqlite3's connection of a transaction begun there.

Inside a SQLite transaction begun in place (``bot.storage.sqlite_driver``), a statement
costs SQLite tens of microseconds; SQLAlchemy's execution around it (a greenlet, the
execution context, the cursor's adapter, the result) costs an accept several times more
than its statements take in SQLite. ``execute`` compiles each statement once, with
SQLAlchemy's own compiler and type processors, and then hands SQL and values straight to
sqlite3: the same SQL and the same stored values as SQLAlchemy's execution would send.

Anywhere else (PostgreSQL, or a transaction that had to wait for another process's write
lock on aiosqlite's thread) it is SQLAlchemy's ``execute``. Only for statements built once
(each is compiled per object), whose columns come back as the driver gives them (text,
numbers, NULL), and whose columns' Python-side defaults are values or functions of no
arguments: compiling anything else raises, rather than store or return something SQLAlchemy
would not (the accept's and the final write's statements use it).

What listens to the engine's ``before_cursor_execute`` / ``after_cursor_execute``
(instrumentation, tests' injected faults) hears these statements too, with no execution
context; an error is raised as SQLAlchemy raises it (``IntegrityError`` for a duplicate).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.compiler import SQLCompiler

from bot.storage.sqlite_driver import OneTripConnection


@dataclass(frozen=True)
class _Compiled:
    sql: str
    compiled: SQLCompiler
    order: tuple[str, ...]
    """The parameters' names in the order of the SQL's placeholders."""
    processors: Mapping[str, Callable[[Any], Any]]
    """What turns a parameter's Python value into the one stored (datetimes, JSON)."""
    defaults: tuple[tuple[str, Any], ...]
    """The columns' Python-side defaults the statement leaves to its execution (an
    INSERT's columns not given, an UPDATE's ``onupdate``), as SQLAlchemy's ``ColumnDefault``."""


_compiled: dict[tuple[Any, frozenset[str]], _Compiled] = {}
"""Per statement (the object: every caller's is built once) and set of parameter names."""


def _compile(statement: Any, names: frozenset[str], dialect: Dialect) -> _Compiled:
    compiled = statement.compile(dialect=dialect, column_keys=sorted(names))
    assert isinstance(compiled, SQLCompiler)
    defaults = tuple((column.key, column.default) for column in compiled.insert_prefetch) + tuple(
        (column.key, column.onupdate) for column in compiled.update_prefetch
    )
    for key, default in defaults:
        if default is None or not (default.is_scalar or default.is_callable):
            raise ValueError(f"in place: column {key!r} has a default of another kind")
    if dialect.paramstyle != "qmark" or compiled.positiontup is None:
        raise ValueError("in place: a dialect without positional parameters")
    for column in statement.exported_columns if statement.is_dml or statement.is_select else ():
        if column.type.dialect_impl(dialect).result_processor(dialect, None) is not None:
            raise ValueError(f"in place: column {column.name!r} needs its type's processing")
    processors = {}
    for bind, name in compiled.bind_names.items():
        processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None:
            processors[name] = processor
    return _Compiled(compiled.string, compiled, tuple(compiled.positiontup), processors, defaults)


def _in_place(sync: Connection) -> sqlite3.Connection | None:
    if sync.dialect.name != "sqlite":
        return None
    driver = sync.connection.dbapi_connection
    return driver.in_place_connection() if isinstance(driver, OneTripConnection) else None


def _bound(compiled: _Compiled, parameters: Mapping[str, Any]) -> tuple[Any, ...]:
    """``parameters`` as sqlite3 takes them: in the SQL's order, defaults filled in,
    each value as its column's type stores it."""
    if compiled.defaults:
        # A callable default is SQLAlchemy's wrapper of a function of no arguments (the
        # models' ``utcnow``, ``new_id``), which takes the execution context: there is none.
        parameters = {
            **{key: d.arg if d.is_scalar else d.arg(None) for key, d in compiled.defaults},
            **parameters,
        }
    values = compiled.compiled.construct_params(parameters)
    processors = compiled.processors
    return tuple(
        processors[name](values[name]) if name in processors else values[name]
        for name in compiled.order
    )


def _run(sync: Connection, raw: sqlite3.Connection, sql: str, bound: Any, many: bool) -> list[Any]:
    dispatch = sync.dispatch
    if dispatch.before_cursor_execute:
        for listener in dispatch.before_cursor_execute:
            listener(sync, None, sql, bound, None, many)
    try:
        rows = (
            raw.executemany(sql, bound).fetchall() if many else raw.execute(sql, bound).fetchall()
        )
    except sqlite3.Error as error:
        raise DBAPIError.instance(sql, bound, error, sqlite3.Error) from error
    if dispatch.after_cursor_execute:
        for listener in dispatch.after_cursor_execute:
            listener(sync, None, sql, bound, None, many)
    return rows


def _compiled_for(statement: Any, names: frozenset[str], sync: Connection) -> _Compiled:
    key = (statement, names)
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = _compiled[key] = _compile(statement, names, sync.dialect)
    return compiled


async def execute(
    connection: AsyncConnection, statement: Any, parameters: Mapping[str, Any]
) -> Sequence[Sequence[Any]]:
    """Run ``statement`` with ``parameters`` on ``connection``: the rows it returns."""
    sync = connection.sync_connection
    raw = None if sync is None else _in_place(sync)
    if sync is None or raw is None:
        result = await connection.execute(statement, dict(parameters))
        return result.all() if result.returns_rows else []
    compiled = _compiled_for(statement, frozenset(parameters), sync)
    return _run(sync, raw, compiled.sql, _bound(compiled, parameters), many=False)


async def execute_many(
    connection: AsyncConnection, statement: Any, rows: Sequence[Mapping[str, Any]]
) -> None:
    """Run ``statement`` (no RETURNING) once for each of ``rows``, which have the same keys."""
    sync = connection.sync_connection
    raw = None if sync is None else _in_place(sync)
    if sync is None or raw is None:
        await connection.execute(statement, [dict(row) for row in rows])
        return
    if not rows:
        return
    compiled = _compiled_for(statement, frozenset(rows[0]), sync)
    _run(sync, raw, compiled.sql, [_bound(compiled, row) for row in rows], many=True)
