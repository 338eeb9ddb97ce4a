"""The OpenAI-compatible API's tests: every SDK client a test opened is closed after it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.openai.helpers import close_sdk_clients


@pytest.fixture(autouse=True)
async def _close_sdk_clients() -> AsyncIterator[None]:
    yield
    await close_sdk_clients()
