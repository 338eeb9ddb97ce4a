"""Property-based fuzzing of the live app: Hypothesis drives, the app's own event loop serves.

Hypothesis runs its examples synchronously, so it runs in a worker thread and
hands each request to the test's event loop, where the real app (and the
shared vLLM engine) live. Every example asserts: no 5xx, a status the route
documents, a JSON ``{"error", "reason"}`` body for a refusal, and, for a
refusal, no row written.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientSession
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from bot.http.openapi import document
from tests.helpers import count_rows

# Examples per property: enough to find the classic crashes, small enough that a
# whole fuzz module stays well under a minute on two cores.
MAX_EXAMPLES = 60
EXAMPLE_TIMEOUT_S = 30.0

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
# Raw bodies that Python's json module refuses in unusual ways, and byte soup.
HOSTILE_BODIES = st.sampled_from(
    [
        b"[" * 5000,
        b'{"a":' * 2000,
        b'{"user_id": ' + b"9" * 5000 + b"}",
        b'"\\ud800"',
        b"\xff\xfe\x00",
        b"",
        b"null",
        b"1e999999",
        b'{"text": "\\u0000"}',
    ]
) | st.binary(max_size=200)
HEADER_VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)


def header_mutations(names: list[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(names), HEADER_VALUES, max_size=3)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _apply(document: Any, path: tuple[Any, ...], action: str, value: Any) -> None:
    parent = document
    for key in path[:-1]:
        try:
            parent = parent[key]
        except (KeyError, IndexError, TypeError):
            return
    last = path[-1]
    if isinstance(parent, dict):
        if action == "delete":
            parent.pop(last, None)
        else:
            parent[last] = value
    elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
        if action == "delete":
            del parent[last]
        else:
            parent[last] = value


@st.composite
def mutated(draw: st.DrawFn, documents: list[dict[str, Any]]) -> dict[str, Any]:
    """One of ``documents`` with a few values replaced, deleted or added (JSON only)."""
    document = copy.deepcopy(draw(st.sampled_from(documents)))
    paths = _paths(document)
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["set", "delete", "add"]))
        if action == "add" or not paths:
            document[draw(st.text(max_size=10))] = draw(JSON_VALUES)
            continue
        _apply(document, draw(st.sampled_from(paths)), action, draw(JSON_VALUES))
    return document


def run_property(
    loop: asyncio.AbstractEventLoop,
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], Awaitable[None]],
    max_examples: int = MAX_EXAMPLES,
) -> None:
    """Run ``check`` on the loop for each example Hypothesis draws (call from a worker thread)."""

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def prop(example: Any) -> None:
        asyncio.run_coroutine_threadsafe(check(example), loop).result(EXAMPLE_TIMEOUT_S)

    prop()


async def fuzz(
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], Awaitable[None]],
    max_examples: int = MAX_EXAMPLES,
) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(run_property, loop, strategy, check, max_examples)


@dataclass
class Ingress:
    """The live app, its database, and the statuses its document lists per route."""

    base_url: str
    db_url: str
    http: ClientSession
    documented: dict[tuple[str, str], set[int]]

    async def send(
        self,
        method: str,
        path: str,
        route: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """Send one request: no 5xx, a documented status, and nothing stored if refused."""
        before = await self.accepted_rows()
        url = URL(self.base_url + path, encoded=True)  # the path is sent as drawn
        async with self.http.request(method, url, data=body, headers=headers or {}) as response:
            status, payload = response.status, await response.read()
            content_type = response.headers.get("Content-Type", "")
        assert status < 500, (status, payload[:300])
        assert status in self.documented[(method.lower(), route)], (route, status, payload[:300])
        if status >= 400:
            assert content_type.startswith("application/json"), (route, path, status, payload[:300])
            assert {"error", "reason"} <= set(json.loads(payload)), payload[:300]
            assert await self.accepted_rows() == before, f"a {status} stored rows"
        return status, payload

    async def accepted_rows(self) -> dict[str, int]:
        """Rows that accepting a message writes (history entries are written later, by turns)."""
        counts = await count_rows(self.db_url)
        return {table: n for table, n in counts.items() if table != "messages"}


def documented_statuses(app: Any) -> dict[tuple[str, str], set[int]]:
    spec = document(app)
    return {
        (method, path): {int(status) for status in operation["responses"]}
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
    }
