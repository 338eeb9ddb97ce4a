"""botctl doctor against a healthy set-up and against each broken layer.

Real pieces throughout: TOML files on disk, SQLite and PostgreSQL, the shared
vLLM engine, the strict Telegram and Slack fakes and small OpenAI-compatible
servers on loopback.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.doctor import CheckResult, run_doctor
from bot.storage.migrate import upgrade
from bot.testing.slack_api import FakeSlackApi
from bot.testing.telegram_api import FakeTelegram
from tests.conftest import POSTGRES_ADMIN_DSN
from tests.ops.helpers import botctl
from tests.ops.openai_servers import API_KEY, SERVED, Behaviour, openai_server

TELEGRAM_TOKEN = "7000000002:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
SLACK_TOKEN = "xoxb-test-doctor"
PUBLIC_URL = "https://bot.example.com"


def toml_value(value: Any) -> str:
    return json.dumps(value)  # JSON strings, numbers, booleans and lists are valid TOML


def write_config(
    path: Path, sections: dict[str, Any], tables: dict[str, list[dict[str, Any]]] | None = None
) -> Path:
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in values.items()]
    for name, items in (tables or {}).items():
        for item in items:
            lines.append(f"[[{name}]]")
            lines += [f"{key} = {toml_value(value)}" for key, value in item.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def layers(results: list[CheckResult]) -> list[tuple[str, bool, str | None]]:
    return [(r.layer, r.ok, r.error_class) for r in results]


@pytest.fixture
async def fake_telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        bot = fake.add_bot(TELEGRAM_TOKEN, "DoctorBot")
        bot.webhook_url = f"{PUBLIC_URL}/telegram/support"
        yield fake


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlackApi]:
    fake = FakeSlackApi()
    fake.add_workspace(SLACK_TOKEN, "T0DOCTOR")
    await fake.start()
    yield fake
    await fake.close()


def base_sections(db_url: str, model_dir: Path) -> dict[str, Any]:
    return {
        "server": {"public_url": PUBLIC_URL},
        "database": {"url": db_url},
        "engine": {"model": str(model_dir), "dtype": "float32", "max_model_len": 1024},
    }


async def test_healthy_service_passes_every_layer(
    db_url: str,
    demo_model_dir: Path,
    engine: Any,
    fake_telegram: FakeTelegram,
    fake_slack: FakeSlackApi,
    tmp_path: Path,
) -> None:
    config = write_config(
        tmp_path / "bot.toml",
        base_sections(db_url, demo_model_dir),
        {
            "telegram": [
                {"name": "support", "token": TELEGRAM_TOKEN, "api_base_url": fake_telegram.base_url}
            ],
            "slack": [
                {
                    "name": "acme",
                    "bot_token": SLACK_TOKEN,
                    "signing_secret": "s3cret",
                    "api_base_url": fake_slack.base_url,
                }
            ],
        },
    )
    results = await run_doctor(config, engine=engine)
    assert layers(results) == [
        ("config", True, None),
        ("database", True, None),
        ("migrations", True, None),
        ("model", True, None),
        ("tokenizer", True, None),
        ("engine", True, None),
        ("telegram:support", True, None),
        ("slack:acme", True, None),
    ]
    assert "generated 1 token" in results[5].detail
    assert "@DoctorBot" in results[6].detail
    assert all(result.ms >= 0 for result in results)
    # Secrets never reach the report.
    report = json.dumps([r.__dict__ for r in results])
    assert TELEGRAM_TOKEN not in report and SLACK_TOKEN not in report


async def test_bad_config_stops_at_the_first_layer_and_names_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.toml", {"server": {"port": 99999, "colour": "blue"}})
    results = await run_doctor(config)
    assert layers(results) == [("config", False, "config")]
    assert "server.port" in results[0].detail and "server.colour" in results[0].detail


async def test_a_bad_access_list_stops_at_config_and_names_the_key(tmp_path: Path) -> None:
    table = {"name": "support", "token": TELEGRAM_TOKEN, "allowed_users": ["alice smith"]}
    config = write_config(tmp_path / "bot.toml", {}, {"telegram": [table]})
    results = await run_doctor(config)
    assert layers(results) == [("config", False, "config")]
    assert "telegram.0.allowed_users" in results[0].detail
    assert "neither a Telegram user id" in results[0].detail


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_database_down_is_a_network_failure_without_the_password(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    url = f"postgresql+asyncpg://bot:hunter2@127.0.0.1:{closed_port()}/bot"
    config = write_config(tmp_path / "bot.toml", base_sections(url, demo_model_dir))
    results = await run_doctor(config)
    assert layers(results) == [("config", True, None), ("database", False, "network")]
    assert "hunter2" not in results[-1].detail
    assert results[-1].hint and "database" in results[-1].hint


async def test_wrong_database_password_is_auth(demo_model_dir: Path, tmp_path: Path) -> None:
    base = POSTGRES_ADMIN_DSN.rsplit("@", 1)[1].rsplit("/", 1)[0]
    url = f"postgresql+asyncpg://nosuchuser:wrong@{base}/postgres"
    config = write_config(tmp_path / "bot.toml", base_sections(url, demo_model_dir))
    results = await run_doctor(config)
    assert results[-1].layer == "database" and results[-1].error_class == "auth"


@pytest.mark.parametrize(
    "empty_db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_pending_migration_names_the_command(
    empty_db_url: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    await asyncio.to_thread(upgrade, empty_db_url, "0001")
    config = write_config(tmp_path / "bot.toml", base_sections(empty_db_url, demo_model_dir))
    results = await run_doctor(config)
    assert layers(results)[-1] == ("migrations", False, "pending_migration")
    assert "0001" in results[-1].detail
    assert results[-1].hint and "botctl db upgrade" in results[-1].hint


async def test_missing_model_folder(sqlite_url: str, tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.toml", base_sections(sqlite_url, tmp_path / "no-model"))
    results = await run_doctor(config)
    assert layers(results)[-1] == ("model", False, "model_not_found")
    assert "botctl demo-model" in (results[-1].hint or "")


def remote_sections(db_url: str, model_dir: Path, base_url: str, **engine: Any) -> dict[str, Any]:
    return {
        "database": {"url": db_url},
        "engine": {
            "kind": "openai",
            "model": SERVED,
            "tokenizer": str(model_dir),
            "base_urls": [base_url],
            "api_key": API_KEY,
            "request_timeout_s": 1.0,
            **engine,
        },
    }


@pytest.mark.parametrize(
    ("behaviour", "error_class", "hint_word"),
    [
        ("healthy", None, None),
        ("unauthorized", "auth", "api_key"),
        ("not_found", "upstream_protocol", "base_url"),
        ("model_missing", "model_not_found", "served_model_name"),
        ("silent", "timeout", "did not answer"),
        ("malformed_json", "upstream_protocol", "OpenAI API"),
        ("html", "upstream_protocol", "OpenAI API"),
    ],
)
async def test_remote_engine(
    behaviour: Behaviour,
    error_class: str | None,
    hint_word: str | None,
    sqlite_url: str,
    demo_model_dir: Path,
    tmp_path: Path,
) -> None:
    async with openai_server(behaviour) as base_url:
        config = write_config(
            tmp_path / "bot.toml", remote_sections(sqlite_url, demo_model_dir, base_url)
        )
        results = await run_doctor(config)
    last = results[-1]
    assert last.layer == f"engine {base_url}"
    assert (last.ok, last.error_class) == (error_class is None, error_class), last
    if hint_word is not None:
        assert hint_word in (last.hint or ""), last.hint
    assert API_KEY not in json.dumps(last.__dict__)


async def test_remote_engine_with_a_wrong_key_is_auth(
    sqlite_url: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with openai_server("healthy") as base_url:
        sections = remote_sections(sqlite_url, demo_model_dir, base_url, api_key="sk-wrong")
        results = await run_doctor(write_config(tmp_path / "bot.toml", sections))
    assert results[-1].error_class == "auth"


async def test_remote_model_name_not_served_is_404_model_not_found(
    sqlite_url: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with openai_server("healthy") as base_url:
        sections = remote_sections(
            sqlite_url, demo_model_dir, base_url, served_model_name="gpt-nope"
        )
        results = await run_doctor(write_config(tmp_path / "bot.toml", sections))
    assert results[-1].error_class == "model_not_found"
    assert "gpt-nope" in results[-1].detail


async def test_remote_engine_that_does_not_listen_is_network(
    sqlite_url: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    base_url = f"http://127.0.0.1:{closed_port()}"
    config = write_config(
        tmp_path / "bot.toml", remote_sections(sqlite_url, demo_model_dir, base_url)
    )
    results = await run_doctor(config)
    assert (results[-1].layer, results[-1].error_class) == (f"engine {base_url}", "network")
    assert "proxy" in (results[-1].hint or "")


async def test_platform_that_rejects_the_token(
    sqlite_url: str,
    demo_model_dir: Path,
    fake_telegram: FakeTelegram,
    fake_slack: FakeSlackApi,
    tmp_path: Path,
) -> None:
    fake_telegram.revoke(TELEGRAM_TOKEN)
    telegram = {"name": "support", "token": TELEGRAM_TOKEN, "api_base_url": fake_telegram.base_url}
    config = write_config(
        tmp_path / "bot.toml", base_sections(sqlite_url, demo_model_dir), {"telegram": [telegram]}
    )
    results = await run_doctor(config, skip=["engine"])
    assert layers(results)[-1] == ("telegram:support", False, "auth")
    assert "BotFather" in (results[-1].hint or "")

    fake_slack.revoke(SLACK_TOKEN)
    slack = {
        "name": "acme",
        "bot_token": SLACK_TOKEN,
        "signing_secret": "s",
        "api_base_url": fake_slack.base_url,
    }
    config = write_config(
        tmp_path / "bot.toml", base_sections(sqlite_url, demo_model_dir), {"slack": [slack]}
    )
    results = await run_doctor(config, skip=["engine"])
    assert layers(results)[-1] == ("slack:acme", False, "auth")


async def test_telegram_webhook_pointing_elsewhere(
    sqlite_url: str, demo_model_dir: Path, fake_telegram: FakeTelegram, tmp_path: Path
) -> None:
    fake_telegram.bots[TELEGRAM_TOKEN].webhook_url = "https://old-host.example.com/telegram/support"
    telegram = {"name": "support", "token": TELEGRAM_TOKEN, "api_base_url": fake_telegram.base_url}
    config = write_config(
        tmp_path / "bot.toml", base_sections(sqlite_url, demo_model_dir), {"telegram": [telegram]}
    )
    results = await run_doctor(config, skip=["engine"])
    assert layers(results)[-1] == ("telegram:support", False, "config")
    assert "old-host" in results[-1].detail
    assert "set-webhook" in (results[-1].hint or "")


async def test_cli_exit_codes_and_json(
    sqlite_url: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    good = write_config(tmp_path / "good.toml", base_sections(sqlite_url, demo_model_dir))
    ok = await botctl("--config", str(good), "doctor", "--skip", "engine", "--json")
    assert ok.exit_code == 0, ok.output
    lines = [json.loads(line) for line in ok.stdout.splitlines()]
    assert [line["layer"] for line in lines] == [
        "config",
        "database",
        "migrations",
        "model",
        "tokenizer",
        "engine",
    ]
    assert lines[-1]["skipped"] is True

    bad = write_config(tmp_path / "bad.toml", base_sections(sqlite_url, tmp_path / "missing"))
    failed = await botctl("--config", str(bad), "doctor")
    assert failed.exit_code == 1
    assert "FAIL  model" in failed.stdout and "hint:" in failed.stdout
