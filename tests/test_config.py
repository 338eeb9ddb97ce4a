"""Settings: TOML file, BOT_* environment overrides, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, Settings, load_settings

EXAMPLE = Path(__file__).resolve().parents[1] / "config.example.toml"


def test_example_config_is_valid() -> None:
    settings = load_settings(EXAMPLE)
    assert settings.server.port == 8080
    assert settings.engine.block_size % 32 == 0


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bot.toml"
    path.write_text("[engine]\nmax_model_len = 1024\n[server]\nport = 9000\n")
    monkeypatch.setenv("BOT_ENGINE__MAX_MODEL_LEN", "4096")
    settings = load_settings(path)
    assert settings.engine.max_model_len == 4096
    assert settings.server.port == 9000


@pytest.mark.parametrize(
    ("document", "bad_key"),
    [
        ("[engine]\nblock_size = 20\n", "engine.block_size"),
        ('[server]\nport = "eighty"\n', "server.port"),
        ("[generation]\ntemperture = 0.5\n", "generation.temperture"),
        ('[[telegram]]\nname = "x"\n', "telegram.0.token"),
        (
            '[[telegram]]\nname = "x"\ntoken = "1:a"\n[[telegram]]\nname = "x"\ntoken = "2:b"\n',
            "telegram: Value error, names must be unique",
        ),
        (
            '[[personas]]\nname = "a"\nsystem_prompt = "x"\n'
            '[[personas]]\nname = "a"\nsystem_prompt = "y"\n',
            "personas: Value error, names must be unique; repeated: a",
        ),
        ('[[personas]]\nname = "Pirate Bob"\nsystem_prompt = "x"\n', "personas.0.name"),
        ('[[personas]]\nname = "pirate"\n', "personas.0.system_prompt"),
        ('[[personas]]\nname = "p"\nsystem_prompt = "x"\ntop_p = 2\n', "personas.0.top_p"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, document: str, bad_key: str) -> None:
    path = tmp_path / "bot.toml"
    path.write_text(document)
    with pytest.raises(ConfigError) as error:
        load_settings(path)
    assert bad_key in str(error.value)
    assert str(path) in str(error.value)


def test_bad_environment_value_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOT_SERVER__PORT", "not-a-port")
    with pytest.raises(ConfigError, match=r"server\.port"):
        load_settings(None)


def test_invalid_toml_and_missing_file_are_clear(tmp_path: Path) -> None:
    path = tmp_path / "bot.toml"
    path.write_text("[engine\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(path)
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "missing.toml")


def test_secrets_are_not_printed(tmp_path: Path) -> None:
    path = tmp_path / "bot.toml"
    path.write_text('[[telegram]]\nname = "support"\ntoken = "123:SECRET-TOKEN"\n')
    settings = load_settings(path)
    assert "SECRET-TOKEN" not in repr(settings)
    assert settings.telegram[0].token.get_secret_value() == "123:SECRET-TOKEN"


def test_example_channel_tables_are_valid_when_uncommented() -> None:
    """The commented [[telegram]], [[slack]] and [[webhooks]] examples name real keys."""
    lines, in_table = [], False
    for line in EXAMPLE.read_text().splitlines():
        if line.startswith("# [["):
            in_table = True
        elif not line.startswith("# "):
            in_table = False
        if in_table:
            line = line[2:].replace('"..."', '"0123456789abcdef0123"')
        lines.append(line)
    settings = load_settings_from_text("\n".join(lines))
    assert [bot.name for bot in settings.telegram] == ["support"]
    assert settings.telegram[0].allowed_users == ["123456789", "alice"]
    assert settings.slack[0].admins == ["U0123ABCD"]
    assert [app.name for app in settings.slack] == ["acme"]
    assert [hook.name for hook in settings.webhooks] == ["crm"]
    assert [persona.name for persona in settings.personas] == ["pirate", "terse"]


def load_settings_from_text(text: str) -> Settings:
    import tomllib

    return Settings(**tomllib.loads(text))
