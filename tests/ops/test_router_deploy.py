"""The router deployments as shipped: compose's ``router`` profile and deploy/k8s/.

Docker and a cluster cannot run here: the files are checked by reading them.
Kubernetes manifests are validated against Kubernetes' own OpenAPI schemas
(``kubernetes-validate``, offline, strict: an unknown field fails); the bot's
settings in each are loaded as the bot would load them; the Helm values of
production-stack and the compose router must route on the header the bot sends.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bot.config import load_settings
from bot.engine.settings import EngineSettings
from tests.ops.test_deploy_files import compose, substitute

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
VALUES = ["production-stack-values.cpu.yaml", "production-stack-values.gpu.yaml"]
SECRET_SETTINGS = {"database.password", "engine.api_key", "tenancy.cache_salt_secret"}
SESSION_HEADER = EngineSettings().session_header


def manifests(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [doc for doc in docs if doc["kind"] == kind]
    return found


@pytest.mark.parametrize("name", ["bot.yaml", "secret.example.yaml"])
def test_manifests_validate_against_the_kubernetes_schemas(name: str) -> None:
    docs = manifests(name)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def load_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str]) -> Any:
    """The bot's settings from ``env`` and one file per secret setting, as mounted."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for name in SECRET_SETTINGS:
        (tmp_path / name).write_text(f"value-of-{name}\n")
    monkeypatch.setenv("BOT_SECRETS_DIR", str(tmp_path))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("BOT_CONFIG", raising=False)
    return load_settings(None)


def test_bot_manifests_point_at_the_router_with_every_secret_as_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    docs = manifests("bot.yaml")
    env = of_kind(docs, "ConfigMap")["data"]
    assert not [key for key in env if re.search(r"PASSWORD|API_KEY|TOKEN|SECRET", key)]
    settings = load_env(monkeypatch, tmp_path, env)
    # One URL, production-stack's router Service for release `vllm` (the values' comment).
    assert settings.engine.base_urls == ["http://vllm-router-service:80"]
    assert settings.engine.session_header == SESSION_HEADER
    assert settings.tenancy.cache_salt_secret is not None, "every worker one salt key"

    deployment = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] >= 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["args"] == ["serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert [e["name"] for e in container["env"]] == ["BOT_WORKERS__ID"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["secrets"] == "/run/secrets"
    secret_volume = next(v for v in pod["volumes"] if v["name"] == "secrets")["secret"]
    example = of_kind(manifests("secret.example.yaml"), "Secret")
    assert secret_volume["secretName"] == example["metadata"]["name"]
    assert set(example["stringData"]) == SECRET_SETTINGS
    assert all(value == "" for value in example["stringData"].values()), "no secret shipped"
    assert of_kind(docs, "Job")["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "db",
        "upgrade",
    ]


@pytest.mark.parametrize("name", VALUES)
def test_production_stack_values_route_by_the_bots_session_header(name: str) -> None:
    values = yaml.safe_load((K8S / name).read_text())
    router = values["routerSpec"]
    assert router["routingLogic"] == "session"
    assert router["sessionKey"] == SESSION_HEADER
    engine = values["servingEngineSpec"]
    # The key comes from an existing Secret, never a literal in the values.
    for holder in (engine, router):
        assert set(holder["vllmApiKey"]) == {"secretName", "secretKey"}
    [model] = engine["modelSpec"]
    assert model["replicaCount"] >= 2
    assert model["vllmConfig"]["enablePrefixCaching"] is True
    assert "--enable-prompt-tokens-details" in model["vllmConfig"]["extraArgs"]
    if name.endswith(".cpu.yaml"):
        assert model["requestGPU"] == 0 and engine["runtimeClassName"] == ""
        assert "--block-size=32" in model["vllmConfig"]["extraArgs"]
    else:
        assert model["requestGPU"] >= 1


def test_compose_router_profile_puts_vllm_router_before_the_replicas(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    services = compose()["services"]
    router = services["vllm-router"]
    assert router["profiles"] == ["router"] and services["vllm-2"]["profiles"] == ["router"]
    command = router["command"]
    assert "--policy=consistent_hash" in command
    workers = command[command.index("--worker-urls") + 1 :]
    assert workers == ["http://vllm:8000", "http://vllm-2:8000"]
    # Both replicas are the same server with the flags the bot relies on.
    assert services["vllm-2"]["command"] == services["vllm"]["command"]
    for name in ("vllm-router", "vllm-2"):
        assert "/health" in " ".join(services[name]["healthcheck"]["test"]), name
    for replica in ("vllm", "vllm-2"):
        assert router["depends_on"][replica]["condition"] == "service_healthy"
    assert services["bot"]["depends_on"]["vllm-router"] == {
        "condition": "service_healthy",
        "required": False,
    }
    assert not any("key" in arg.lower() for arg in command), "no key on a command line"

    # The bot behind it, as the compose file's comment starts it: the router's URL alone.
    started = re.search(
        r"BOT_ENGINE_BASE_URLS='([^']+)'", (ROOT / "deploy/compose.yaml").read_text()
    )
    assert started is not None
    env = {
        key: substitute(str(value), {"BOT_ENGINE_BASE_URLS": started.group(1)})
        for key, value in services["bot"]["environment"].items()
        if key.startswith("BOT_")
    }
    settings = load_env(monkeypatch, tmp_path, env)
    assert settings.engine.base_urls == ["http://vllm-router:8000"]
    assert json.loads(started.group(1)) == settings.engine.base_urls
    assert settings.engine.session_header == SESSION_HEADER


def test_router_image_pins_the_version_the_tests_run() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [pin] = project["project"]["optional-dependencies"]["router"]
    dockerfile = (ROOT / "deploy" / "Dockerfile.router").read_text()
    assert f"pip install {pin}" in dockerfile
    users = re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    image = compose()["services"]["vllm-router"]["image"]
    assert image.endswith(":" + pin.split("==")[1])
