"""A database error during a turn never puts the user's text into a log line or an error.

The database refuses the turn's history write (a CHECK constraint on PostgreSQL, whose
DETAIL quotes the whole refused row; a trigger on SQLite), so the statement that fails
carries the user's text as a parameter. Every log line of the service (its own renderer,
stdlib records, stdout and stderr) and the stored error are searched for that text.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from bot.ops.log import configure_logging
from bot.storage.db import create_engine, is_sqlite
from tests.conftest import MakeClient, issue_key
from tests.helpers import load_turns
from tests.ops.helpers import chat

SECRET = "hunter2-correct-horse-7f3a9c"
MARKER = "horse-7f3a"
"""What the database refuses: a part of the secret, so the rule's own text is not the secret."""


@pytest.fixture
def service_log() -> Iterator[io.StringIO]:
    """The service's own log set-up (JSON lines, tracebacks rendered), into a buffer; with
    SQLAlchemy's statement log on, which is where parameters would show."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_structlog = structlog.get_config()
    sql_logger = logging.getLogger("sqlalchemy.engine")
    saved_sql_level = sql_logger.level
    buffer = io.StringIO()
    configure_logging("DEBUG", "json", buffer)
    sql_logger.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        sql_logger.setLevel(saved_sql_level)
        structlog.configure(**saved_structlog)


async def _refuse_history_entries_holding(db_url: str, marker: str) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.begin() as connection:
            if is_sqlite(db_url):
                await connection.execute(
                    text(
                        "CREATE TRIGGER test_refuse BEFORE INSERT ON messages "
                        f"WHEN instr(NEW.text, '{marker}') > 0 "
                        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
                    )
                )
            else:
                await connection.execute(
                    text(
                        "ALTER TABLE messages ADD CONSTRAINT test_refuse "
                        f"CHECK (position('{marker}' in text) = 0) NOT VALID"
                    )
                )
    finally:
        await engine.dispose()


async def test_a_refused_write_of_a_secret_logs_no_secret(
    db_url: str,
    make_client: MakeClient,
    service_log: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    client = await make_client(db_url)
    await _refuse_history_entries_holding(db_url, MARKER)
    key = await issue_key(db_url)

    final = await chat(client, key, "c1", "m1", f"my password is {SECRET}, keep it")

    [turn] = await load_turns(db_url)
    assert turn.status == "failed", (final, turn.status)
    assert turn.user_text.endswith(f"{SECRET}, keep it")  # stored, as it should be
    captured = capsys.readouterr()
    records = "\n".join(_record_text(record) for record in caplog.records)
    everything = {
        "service log": service_log.getvalue(),
        "stdlib records": records,
        "stdout": captured.out,
        "stderr": captured.err,
        "stored error": turn.error_message or "",
        "final event": repr(final),
    }
    for where, content in everything.items():
        assert SECRET not in content, f"the secret is in the {where}"
    assert "refuse" in service_log.getvalue(), "the database error was logged"
    assert "hidden due to hide_parameters" in service_log.getvalue() + records


async def test_the_refused_statements_error_and_traceback_hold_no_secret(db_url: str) -> None:
    """The error itself, with its whole chain as a traceback renders it: no parameters, and
    not PostgreSQL's DETAIL ("Failing row contains (...)", the row with the secret)."""
    await _refuse_history_entries_holding(db_url, MARKER)
    engine = create_engine(db_url)
    try:
        with pytest.raises(DBAPIError) as raised:
            async with engine.begin() as connection:
                await connection.execute(
                    text(
                        "INSERT INTO messages (conversation_id, seq, role, text, token_ids,"
                        " created_at) VALUES (:conversation, 1, 'user', :text, :ids, :at)"
                    ),
                    {
                        "conversation": "c" * 32,
                        "text": f"my password is {SECRET}",
                        "ids": b"",
                        "at": dt.datetime.now(dt.UTC),
                    },
                )
    finally:
        await engine.dispose()
    rendered = "".join(traceback.format_exception(raised.value))
    assert "test_refuse" in rendered or "refused by the test" in rendered
    assert SECRET not in rendered, rendered


def _record_text(record: logging.LogRecord) -> str:
    parts: list[Any] = [record.getMessage(), record.msg, record.args]
    if record.exc_info:
        parts.append(logging.Formatter().formatException(record.exc_info))
    return " ".join(str(part) for part in parts)
