"""Shared by the turn-lifecycle tests: faults injected at the app's own statements."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from tests.helpers import app_sync_engines


@dataclass
class _Rule:
    pattern: re.Pattern[str]
    remaining: int | None  # None: until cleared


class WriteFaults:
    """Makes chosen statements of the app's own database engine fail like a lost connection."""

    def __init__(self, client: TestClient[Any, Any]) -> None:
        self._engines = app_sync_engines(client.app)  # the requests' and the turns'
        self._rules: list[_Rule] = []
        self.raised = 0
        for engine in self._engines:
            event.listen(engine, "before_cursor_execute", self._check)

    def fail(self, pattern: str, times: int | None = None) -> None:
        self._rules.append(_Rule(re.compile(pattern, re.DOTALL), times))

    def clear(self) -> None:
        self._rules.clear()

    def close(self) -> None:
        for engine in self._engines:
            event.remove(engine, "before_cursor_execute", self._check)

    def _check(self, _conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        for rule in self._rules:
            if rule.pattern.search(statement) and rule.remaining != 0:
                if rule.remaining is not None:
                    rule.remaining -= 1
                self.raised += 1
                raise OperationalError(statement, params, ConnectionResetError("injected fault"))


@pytest.fixture
def faults() -> Iterator[list[WriteFaults]]:
    made: list[WriteFaults] = []
    yield made
    for fault in made:
        fault.close()
