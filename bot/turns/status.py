"""The status a turn is shown with: ``stopped`` for a turn someone stopped.

A stopped turn is stored ``failed`` with error class ``cancelled`` (a final state
like any failure: it is never run again, its partial reply is kept). But nothing
went wrong: the user or an operator asked for it. So wherever a status is shown
(the HTTP API's turn documents, ``botctl conversations``, usage reports) it reads
``stopped``, and usage counts it apart from ``failed``.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_

from bot.errors import ErrorClass
from bot.storage.models import Turn, TurnStatus

STOPPED = "stopped"
"""Shown, never stored."""


def shown_status(status: str, error_class: str | None) -> str:
    """``status`` as people see it: ``stopped`` for a failed turn that was cancelled."""
    if status == TurnStatus.FAILED and error_class == ErrorClass.CANCELLED.value:
        return STOPPED
    return status


def is_stopped() -> ColumnElement[bool]:
    """The same rule in SQL, for counting (``bot.turns.usage``)."""
    return and_(Turn.status == TurnStatus.FAILED, Turn.error_class == ErrorClass.CANCELLED.value)


def is_failed() -> ColumnElement[bool]:
    """Failed for a reason other than being stopped (a NULL error class counts as failed)."""
    return and_(
        Turn.status == TurnStatus.FAILED,
        Turn.error_class.is_distinct_from(ErrorClass.CANCELLED.value),
    )
