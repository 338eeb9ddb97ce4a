"""The notify protocol on a real datagram socket, and the unit file through systemd-analyze."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bot.ops import systemd

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "bot.service"
INGRESS_UNIT = ROOT / "deploy" / "bot-ingress.service"


def test_notify_is_a_no_op_outside_systemd() -> None:
    assert systemd.notify("READY=1", environ={}) is False


def test_notify_sends_one_datagram_to_a_path_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        assert systemd.notify("READY=1", "STATUS=up", environ={"NOTIFY_SOCKET": str(path)})
        assert server.recv(4096) == b"READY=1\nSTATUS=up"


def test_notify_reaches_an_abstract_socket() -> None:
    name = f"bot-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        assert systemd.notify("WATCHDOG=1", environ={"NOTIFY_SOCKET": "@" + name})
        assert server.recv(4096) == b"WATCHDOG=1"


def test_notify_never_blocks_on_a_full_queue(tmp_path: Path) -> None:
    # Regression: a blocking send to an unread socket froze the event loop.
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(str(path))
        sent = [
            systemd.notify("WATCHDOG=1", environ={"NOTIFY_SOCKET": str(path)}) for _ in range(2000)
        ]
        assert sent[0] is True and sent[-1] is False


def test_notify_to_a_missing_socket_returns_false(tmp_path: Path) -> None:
    assert systemd.notify("READY=1", environ={"NOTIFY_SOCKET": str(tmp_path / "gone")}) is False


def test_watchdog_interval_is_half_the_timeout_and_only_for_this_pid() -> None:
    assert systemd.watchdog_interval_s({}) is None
    assert systemd.watchdog_interval_s({"WATCHDOG_USEC": "60000000"}) == 30.0
    mine = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert systemd.watchdog_interval_s(mine) == 1.0
    assert systemd.watchdog_interval_s({**mine, "WATCHDOG_PID": "1"}) is None


def unit_settings(unit: Path = UNIT) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def test_unit_declares_notify_watchdog_restart_user_hardening_and_a_stop_timeout() -> None:
    unit = unit_settings()
    assert unit["Type"] == ["notify"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["User"] == ["bot"]
    assert int(unit["WatchdogSec"][0]) > 0
    for key, expected in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
    }.items():
        assert unit[key] == [expected], key
    assert unit["ReadWritePaths"] and unit["EnvironmentFile"] == ["-/etc/bot/bot.env"]
    # Secrets as credentials, named after their settings (bot.secret_files), not variables.
    assert unit["LoadCredential"] == ["database.password:/etc/bot/credentials/database.password"]
    # The stop timeout covers the default drain (30 s) plus the engine's shutdown.
    from bot.config import ServerSettings

    assert int(unit["TimeoutStopSec"][0]) >= ServerSettings().shutdown_grace_s + 30
    command = unit["ExecStart"][0].split()
    assert command[0] == "/opt/bot/.venv/bin/botctl" and command[1:] == ["serve"]


def unit_lines(unit: Path) -> set[tuple[str, str]]:
    return {(key, value) for key, values in unit_settings(unit).items() for value in values}


def test_the_ingress_unit_is_the_service_unit_with_only_its_own_lines_changed() -> None:
    """One hardening, one layout, one set of secrets: the ingress unit differs from
    bot.service only in what makes it an ingress, so the two cannot drift apart."""
    service, ingress = unit_lines(UNIT), unit_lines(INGRESS_UNIT)
    assert {key for key, _ in service - ingress} == {"Description", "TimeoutStartSec"}
    assert {key for key, _ in ingress - service} == {"Description", "TimeoutStartSec"} | {
        "Environment",
        "Nice",
        "CPUWeight",
    }
    ingress_settings = unit_settings(INGRESS_UNIT)
    assert int(ingress_settings["Nice"][0]) < 0 and int(ingress_settings["CPUWeight"][0]) > 100


def test_the_ingress_unit_runs_no_turn_on_a_port_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bot.config import ServerSettings, load_settings

    monkeypatch.delenv("BOT_CONFIG", raising=False)
    monkeypatch.setenv("BOT_DATABASE__URL", "postgresql+asyncpg://bot@127.0.0.1/bot")
    for assignment in unit_settings(INGRESS_UNIT)["Environment"]:
        name, _, value = assignment.partition("=")
        if name.startswith("BOT_") and name != "BOT_CONFIG":  # the file is the host's
            monkeypatch.setenv(name, value)
    settings = load_settings(None)
    assert settings.workers.run_turns is False
    # bot.service sets no port: it listens on the default, which the ingress must leave it.
    assert settings.server.port != ServerSettings().port


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
@pytest.mark.parametrize("source", [UNIT, INGRESS_UNIT], ids=lambda path: path.name)
def test_systemd_analyze_verify_passes_without_warnings(tmp_path: Path, source: Path) -> None:
    # verify checks that ExecStart exists: point it at this checkout's botctl.
    botctl = Path(sys.executable).parent / "botctl"
    text = source.read_text().replace("/opt/bot/.venv/bin/botctl", str(botctl))
    # The credential's file is the host's, as the environment file is.
    text = text.replace("LoadCredential=database.password:/etc/bot/credentials/", "#")
    unit = tmp_path / source.name
    unit.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
