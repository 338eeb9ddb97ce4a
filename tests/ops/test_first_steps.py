"""A newcomer's first commands, as real ``botctl`` processes in a fresh folder.

``botctl init`` writes ``bot.toml`` (``make run`` runs it), and every later
command run in that folder reads it: ``db upgrade``, ``keys create`` and
``doctor`` see the model and database the service serves, and ``doctor --json``
prints one JSON document on stdout, whatever the engine's processes write.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from tests.conftest import TEST_BLOCK_SIZE, TEST_MAX_MODEL_LEN

BOTCTL = str(Path(sys.executable).parent / "botctl")


def _env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("BOT_")}
    # The demo model as the tests run it (its context is 1024 tokens).
    env["BOT_ENGINE__DTYPE"] = "float32"
    env["BOT_ENGINE__MAX_MODEL_LEN"] = str(TEST_MAX_MODEL_LEN)
    env["BOT_ENGINE__BLOCK_SIZE"] = str(TEST_BLOCK_SIZE)
    return {**env, **extra}


async def _botctl(folder: Path, *args: str, **env: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        BOTCTL,
        *args,
        cwd=folder,
        env=_env(**env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(600):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_init_then_every_command_sees_the_same_settings(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path / 'bot.db'}"
    code, _, err = await _botctl(
        tmp_path, "init", "--model", str(demo_model_dir), "--database", database
    )
    assert code == 0, err
    written = (tmp_path / "bot.toml").read_text(encoding="utf-8")
    assert str(demo_model_dir) in written and database in written

    # A second init leaves the file (and whatever someone edited in it) alone.
    (tmp_path / "bot.toml").write_text(written + "# edited\n", encoding="utf-8")
    code, _, err = await _botctl(tmp_path, "init", "--model", "other")
    assert code == 0 and "left as it is" in err
    assert (tmp_path / "bot.toml").read_text(encoding="utf-8").endswith("# edited\n")

    code, _, err = await _botctl(tmp_path, "db", "upgrade")
    assert code == 0, err
    assert (tmp_path / "bot.db").exists(), "db upgrade used bot.toml's database"
    code, key, err = await _botctl(tmp_path, "keys", "create", "newcomer")
    assert code == 0 and key.startswith("bot_"), err

    code, out, err = await _botctl(tmp_path, "doctor", "--json")
    assert code == 0, err
    report = json.loads(out)  # exactly one document: anything else on stdout fails here
    assert report["ok"] is True and report["failed_layer"] is None
    assert [layer["layer"] for layer in report["layers"]] == [
        "config",
        "database",
        "migrations",
        "model",
        "tokenizer",
        "engine",
    ]
    assert report["layers"][0]["detail"].startswith("bot.toml")
    assert "generated 1 token" in report["layers"][5]["detail"]

    # BOT_CONFIG set but empty: the built-in defaults (the demo model), not ./bot.toml.
    code, out, _ = await _botctl(
        tmp_path,
        "doctor",
        "--json",
        "--skip",
        "engine",
        BOT_CONFIG="",
        BOT_DATABASE__URL=database,
    )
    assert code == 1
    failed = json.loads(out)
    assert failed["ok"] is False and failed["failed_layer"] == "model"
    assert "demo-model" in failed["layers"][-1]["detail"]
