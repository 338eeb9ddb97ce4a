"""Helpers of the ops tests: run botctl in-process, post a turn, read Prometheus text."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families

from bot.cli import main
from tests.helpers import auth, read_sse


async def botctl(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
    """Run ``botctl ARGS`` in a thread: commands call ``asyncio.run`` themselves."""
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, main, list(args), env=env, input=input, catch_exceptions=False
    )


async def chat(
    client: TestClient[Any, Any], key: str, conversation: str, message_id: str, text: str = "Hi"
) -> dict[str, Any]:
    """Post a message and read its reply to the end; returns the final event's data and kind."""
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": conversation, "message_id": message_id, "text": text},
        headers=auth(key),
    )
    assert response.status == 202, await response.text()
    body = await response.json()
    events = await read_sse(await client.get(body["stream_url"], headers=auth(key)))
    return {"kind": events[-1].kind, **events[-1].data, **body}


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text -> {(sample name, labels): value}."""
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return values


def value(
    values: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)
