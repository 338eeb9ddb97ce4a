"""botctl --version and click's shell completion, through the real command group."""

from __future__ import annotations

import importlib.metadata

from click.testing import CliRunner

from bot.cli import DISTRIBUTION, main


def test_version_is_the_installed_distribution_version() -> None:
    result = CliRunner().invoke(main, ["--version"], prog_name="botctl")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"botctl, version {importlib.metadata.version(DISTRIBUTION)}"


def test_bash_completion_script_is_produced() -> None:
    result = CliRunner().invoke(
        main, [], prog_name="botctl", env={"_BOTCTL_COMPLETE": "bash_source"}
    )
    assert result.exit_code == 0, result.output
    assert "_botctl_completion()" in result.stdout
    assert "complete -o nosort -F _botctl_completion botctl" in result.stdout


def test_completion_offers_the_command_groups() -> None:
    result = CliRunner().invoke(
        main,
        [],
        prog_name="botctl",
        env={"_BOTCTL_COMPLETE": "bash_complete", "COMP_WORDS": "botctl ke", "COMP_CWORD": "1"},
    )
    assert result.exit_code == 0, result.output
    assert "plain,keys" in result.stdout.splitlines()
