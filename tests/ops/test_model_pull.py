"""``botctl model pull ORG/NAME`` against a Hub on loopback (``bot/testing/hf_hub.py``).

Each pull runs as a real ``botctl`` process with ``HF_ENDPOINT`` pointing at
the fake: a bad id is one line, the revision is pinned to its commit in the
marker, only the files a model needs are fetched, and no pickle without
``--allow-pickle``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.models.folders import MARKER_FILE
from bot.testing.hf_hub import FakeHub

MODEL = "acme/tiny-chat"
NEEDED = {
    "config.json": b'{"model_type": "llama"}',
    "generation_config.json": b'{"temperature": 0.7}',
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b"{}",
    "special_tokens_map.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
    "model-00001-of-00002.safetensors": b"weights-1",
    "model-00002-of-00002.safetensors": b"weights-2",
    "model.safetensors.index.json": b'{"weight_map": {}}',
}
EXTRAS = {
    "pytorch_model.bin": b"pickle that runs code",
    "consolidated.safetensors": b"the same weights again",
    "README.md": b"# tiny",
    ".gitattributes": b"*.bin filter=lfs",
    "onnx/model.onnx": b"onnx",
    "original/consolidated.00.pth": b"another pickle",
    "training_args.bin": b"pickle",
}


@pytest.fixture
async def hub() -> AsyncIterator[FakeHub]:
    async with FakeHub() as fake:
        yield fake


async def botctl(hub: FakeHub, home: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "botctl"),
        "model",
        "pull",
        *args,
        env={
            **os.environ,
            "HF_ENDPOINT": hub.base_url,
            "HF_HOME": str(home / "hf-home"),
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def assert_one_line_error(code: int, err: str) -> None:
    assert code == 1, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err


@pytest.mark.parametrize(
    "model_id", ["not a model!", "../../etc/passwd", "tiny-chat", "a/b/c", "acme/x--y", ""]
)
async def test_a_bad_id_is_one_line_and_nothing_is_written(
    hub: FakeHub, tmp_path: Path, model_id: str
) -> None:
    target = tmp_path / "models" / "m"
    code, _, err = await botctl(hub, tmp_path, model_id, "--path", str(target), "-q")
    assert_one_line_error(code, err)
    assert "ORG/NAME" in err
    assert not target.exists() and hub.fetched == []


async def test_only_what_a_model_needs_is_fetched_at_one_commit(
    hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.add_model(MODEL, {**NEEDED, **EXTRAS})
    target = tmp_path / "tiny"
    code, out, err = await botctl(hub, tmp_path, MODEL, "--path", str(target), "-q")
    assert code == 0, err
    assert out.strip() == str(target)

    assert hub.paths_fetched() == sorted(NEEDED)
    assert {f.revision for f in hub.fetched} == {commit}, "every file from the resolved commit"
    on_disk = sorted(str(path.relative_to(target)) for path in target.rglob("*") if path.is_file())
    assert on_disk == sorted([*NEEDED, MARKER_FILE])
    for name, content in NEEDED.items():
        assert (target / name).read_bytes() == content
    marker = json.loads((target / MARKER_FILE).read_text())
    assert marker["commit"] == commit and marker["revision"] == "main"
    assert marker["files"] == sorted(NEEDED)

    # The branch moves on; the folder stays the version it was, and a second pull is a no-op.
    hub.add_model(MODEL, {**NEEDED, "config.json": b'{"model_type": "mistral"}'})
    code, _, err = await botctl(hub, tmp_path, MODEL, "--path", str(target))
    assert code == 0 and "already complete" in err
    assert (target / "config.json").read_bytes() == NEEDED["config.json"]


async def test_a_tag_resolves_to_its_commit(hub: FakeHub, tmp_path: Path) -> None:
    tagged = hub.add_model(MODEL, NEEDED, tag="v1.0")
    hub.add_model(MODEL, {**NEEDED, "config.json": b'{"model_type": "newer"}'})
    target = tmp_path / "v1"
    code, _, err = await botctl(
        hub, tmp_path, MODEL, "--revision", "v1.0", "--path", str(target), "-q"
    )
    assert code == 0, err
    marker = json.loads((target / MARKER_FILE).read_text())
    assert (marker["revision"], marker["commit"]) == ("v1.0", tagged)
    assert (target / "config.json").read_bytes() == NEEDED["config.json"]

    code, _, err = await botctl(
        hub, tmp_path, MODEL, "--revision", "no-such-tag", "--path", str(tmp_path / "x")
    )
    assert_one_line_error(code, err)
    assert not (tmp_path / "x").exists()


async def test_pickles_only_with_allow_pickle(hub: FakeHub, tmp_path: Path) -> None:
    weights = {name: content for name, content in NEEDED.items() if "safetensors" not in name}
    hub.add_model(MODEL, {**weights, "pytorch_model.bin": b"pickle that runs code"})
    refused = tmp_path / "refused"
    code, _, err = await botctl(hub, tmp_path, MODEL, "--path", str(refused), "-q")
    assert_one_line_error(code, err)
    assert "--allow-pickle" in err
    assert not refused.exists() and hub.paths_fetched() == []

    allowed = tmp_path / "allowed"
    code, _, err = await botctl(
        hub, tmp_path, MODEL, "--allow-pickle", "--path", str(allowed), "-q"
    )
    assert code == 0, err
    assert (allowed / "pytorch_model.bin").read_bytes() == b"pickle that runs code"


async def test_an_unknown_model_is_one_line(hub: FakeHub, tmp_path: Path) -> None:
    code, _, err = await botctl(hub, tmp_path, "acme/missing", "--path", str(tmp_path / "m"))
    assert_one_line_error(code, err)
    assert "not available on the Hugging Face Hub" in err
    assert not (tmp_path / "m").exists()
