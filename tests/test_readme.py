"""README.md is for people: short, every link and command real, its first curl asks its question."""

from __future__ import annotations

import re
from pathlib import Path

from tests.ops.test_deploy_files import botctl_command_exists

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250


def test_it_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_every_relative_link_exists() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(((?!https?://)[^)#]+)", text)
    assert targets
    for target in targets:
        assert (ROOT / target).exists(), target


def test_every_botctl_command_exists() -> None:
    text = README.read_text(encoding="utf-8")
    found = re.findall(r"botctl ((?:[a-z][a-z-]* ?)+)", text)
    assert found
    for match in found:
        words = match.split()[:2]
        assert botctl_command_exists(words) or botctl_command_exists(words[:1]), match


def test_the_first_curl_asks_the_question_the_readme_answers() -> None:
    text = README.read_text(encoding="utf-8")
    first_curl = text[text.index("curl ") :].split("```", 1)[0]
    assert "What is the capital of France?" in first_curl
    assert "Paris" in text[text.index("curl ") :]


def test_the_test_command_is_the_one_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make test-all" in text
    assert "make test-all" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
