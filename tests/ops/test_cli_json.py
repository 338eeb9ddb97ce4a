"""``--json`` on botctl's list and show commands: stdout parses, and says what the text says."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.conftest import issue_key
from tests.ops.helpers import botctl


def env(db_url: str) -> dict[str, str]:
    return {"BOT_DATABASE__URL": db_url, "BOT_CONFIG": ""}


@pytest.mark.parametrize(
    "empty_db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_db_current_and_history_as_json(empty_db_url: str) -> None:
    e = env(empty_db_url)
    before = json.loads((await botctl("db", "current", "--json", env=e)).stdout)
    assert before["revision"] is None and before["up_to_date"] is False

    assert (await botctl("db", "upgrade", env=e)).exit_code == 0
    after = json.loads((await botctl("db", "current", "--json", env=e)).stdout)
    assert after["revision"] == after["head"] and after["up_to_date"] is True
    assert after["revision"] == (await botctl("db", "current", env=e)).stdout.strip()

    history = [
        json.loads(line)
        for line in (await botctl("db", "history", "--json", env=e)).stdout.splitlines()
    ]
    assert history[0]["revision"] == "0001" and history[0]["down_revision"] is None
    assert [row["revision"] for row in history if row["current"]] == [after["revision"]]
    assert all(
        later["down_revision"] == earlier["revision"]
        for earlier, later in itertools.pairwise(history)
    )


async def test_limits_show_as_json(db_url: str) -> None:
    await issue_key(db_url, "slow")
    await issue_key(db_url, "fast")
    e = env(db_url)
    setting = await botctl(
        "limits",
        "set",
        "--key",
        "slow",
        "--messages-per-minute",
        "3",
        "--tokens-per-day",
        "900",
        env=e,
    )
    assert setting.exit_code == 0, setting.output

    shown = await botctl("limits", "show", "--json", env=e)
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.stdout)
    assert set(document["defaults"]) == {"messages_per_minute", "tokens_per_day"}
    [slow] = document["subjects"]
    assert slow["subject"].startswith("key:")
    assert (slow["messages_per_minute"], slow["tokens_per_day"], slow["tokens_used_today"]) == (
        3,
        900,
        0,
    )

    only_fast = json.loads(
        (await botctl("limits", "show", "--key", "fast", "--json", env=e)).stdout
    )
    [fast] = only_fast["subjects"]
    assert fast["subject"] != slow["subject"]
    assert fast["messages_per_minute"] == document["defaults"]["messages_per_minute"]
