"""deploy/grafana's dashboard imports without edits and asks only for metrics we export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bot.http.keys import TURNS
from tests.conftest import MakeClient, issue_key
from tests.helpers import admin_key, auth
from tests.ops.helpers import chat, samples

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "llm-chat-bot.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# PromQL words that look like names but are not metrics.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset"}  # fmt: skip
IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (labels, ranges and groupings dropped)."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    return {name for name in IDENTIFIER.findall(bare) if name not in KEYWORDS}


def targets(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [target for panel in dashboard["panels"] for target in panel["targets"]]


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'sum by (le) (rate(bot_layer_bucket{layer="queue"}[$__rate_interval])) '
        "/ sum(vllm:prefix_cache_hits_total[5m]) * 0.5"
    )
    assert metric_names(expr) == {"bot_layer_bucket", "vllm:prefix_cache_hits_total"}


def test_dashboard_takes_its_datasource_from_a_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [variable] = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "DS_PROMETHEUS",
        "datasource",
        "prometheus",
    )
    assert "id" not in dashboard or dashboard["id"] is None  # an id would clash on import
    for panel in dashboard["panels"]:
        assert panel["datasource"] == DATASOURCE
    assert all(target["datasource"] == DATASOURCE for target in targets(dashboard))
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("first token", "cache", "error class", "queue"):
        assert topic in titles


async def test_every_dashboard_metric_is_in_a_real_scrape(
    sqlite_url: str, make_client: MakeClient
) -> None:
    client = await make_client(sqlite_url)
    key = await issue_key(sqlite_url)
    assert (await chat(client, key, "c1", "m0", "Hello"))["kind"] == "done"
    await client.server.app[TURNS].wait_idle(timeout=30)
    response = await client.get("/metrics", headers=auth(await admin_key(sqlite_url)))
    exported = {name for name, _ in samples(await response.text())}

    wanted = set().union(
        *(metric_names(target["expr"]) for target in targets(json.loads(DASHBOARD.read_text())))
    )
    assert {"bot_turn_ttft_seconds_bucket", "vllm:prefix_cache_queries_total"} <= wanted
    assert sorted(wanted - exported) == []
