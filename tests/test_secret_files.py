"""Secret settings from files: each source, their order, and the refusals (``bot.secret_files``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, load_settings
from bot.secret_files import scrub_environment
from bot.storage.redact import redact

TOKEN = "7000000001:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
SLACK = '[[slack]]\nname = "acme"\n'
WEBHOOK = '[[webhooks]]\nname = "crm"\ncallback_url = "https://example.com/hook"\n'


@pytest.fixture(autouse=True)
def no_outside_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Neither this machine's /run/secrets nor a systemd credential reaches these tests."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setenv("BOT_SECRETS_DIR", str(tmp_path / "no-docker-secrets"))
    for name in ("BOT_CONFIG", "BOT_DATABASE__URL", "BOT_ENGINE__API_KEY"):
        monkeypatch.delenv(name, raising=False)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def config(tmp_path: Path, text: str) -> Path:
    return write(tmp_path / "bot.toml", text)


def test_key_file_in_the_toml_file(tmp_path: Path) -> None:
    url = write(tmp_path / "s" / "url", "postgresql+asyncpg://bot:pw@db/bot\n")
    key = write(tmp_path / "s" / "key", "sk-remote\n")
    token = write(tmp_path / "s" / "token", TOKEN)
    previous = write(
        tmp_path / "s" / "previous", "old-secret-0123456789\nolder-secret-0123456789\n"
    )
    secret = write(tmp_path / "s" / "secret", "current-secret-0123456789")
    settings = load_settings(
        config(
            tmp_path,
            f'[database]\nurl_file = "{url}"\n[engine]\napi_key_file = "{key}"\n'
            f'[[telegram]]\nname = "support"\ntoken_file = "{token}"\n'
            f'{WEBHOOK}secret_file = "{secret}"\nprevious_secrets_file = "{previous}"\n',
        )
    )
    assert settings.database.url == "postgresql+asyncpg://bot:pw@db/bot"
    assert settings.engine.api_key is not None
    assert settings.engine.api_key.get_secret_value() == "sk-remote"
    assert settings.telegram[0].token.get_secret_value() == TOKEN
    hook = settings.webhooks[0]
    assert hook.secret.get_secret_value() == "current-secret-0123456789"
    assert [s.get_secret_value() for s in hook.previous_secrets] == [
        "old-secret-0123456789",
        "older-secret-0123456789",
    ]


def test_environment_file_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = write(tmp_path / "url", "sqlite+aiosqlite:///from-env-file.db\n")
    monkeypatch.setenv("BOT_DATABASE__URL_FILE", str(url))
    settings = load_settings(config(tmp_path, '[database]\nurl = "sqlite+aiosqlite:///toml.db"\n'))
    assert settings.database.url == "sqlite+aiosqlite:///from-env-file.db"


def test_systemd_credentials_and_docker_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    docker = tmp_path / "docker"
    write(credentials / "database.url", "sqlite+aiosqlite:///credential.db")
    write(credentials / "slack.acme.signing_secret", "signing-from-systemd")
    write(docker / "database.url", "sqlite+aiosqlite:///docker.db")
    write(docker / "slack.acme.bot_token", "xoxb-from-docker")
    write(docker / "tenancy.cache_salt_secret", "salt-from-docker")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    monkeypatch.setenv("BOT_SECRETS_DIR", str(docker))
    settings = load_settings(config(tmp_path, SLACK))
    assert settings.database.url == "sqlite+aiosqlite:///credential.db"  # systemd first
    app = settings.slack[0]
    assert app.signing_secret.get_secret_value() == "signing-from-systemd"
    assert app.bot_token.get_secret_value() == "xoxb-from-docker"
    assert settings.tenancy.cache_salt_secret is not None
    assert settings.tenancy.cache_salt_secret.get_secret_value() == "salt-from-docker"


def test_the_order_of_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment, then the TOML file, then systemd credentials, then Docker secrets."""
    credentials = write(tmp_path / "credentials" / "database.url", "sqlite+aiosqlite:///c.db")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials.parent))
    toml = config(tmp_path, '[database]\nurl = "sqlite+aiosqlite:///toml.db"\n')
    assert load_settings(toml).database.url == "sqlite+aiosqlite:///toml.db"
    monkeypatch.setenv("BOT_DATABASE__URL", "sqlite+aiosqlite:///env.db")
    assert load_settings(toml).database.url == "sqlite+aiosqlite:///env.db"
    assert load_settings(None).database.url == "sqlite+aiosqlite:///env.db"
    monkeypatch.delenv("BOT_DATABASE__URL")
    assert load_settings(None).database.url == "sqlite+aiosqlite:///c.db"


def test_a_password_of_its_own_is_escaped_into_the_url(tmp_path: Path) -> None:
    password = write(tmp_path / "password", "p@ss/w:rd%1\n")
    settings = load_settings(
        config(
            tmp_path,
            '[database]\nurl = "postgresql+asyncpg://bot@db.internal:5432/bot"\n'
            f'password_file = "{password}"\n',
        )
    )
    url = settings.database.url
    assert url == "postgresql+asyncpg://bot:p%40ss%2Fw%3Ard%251@db.internal:5432/bot"
    assert "p@ss" not in redact(url, url)


@pytest.mark.parametrize(
    ("document", "files", "reason"),
    [
        ('[database]\nurl = "x"\nurl_file = "{f}"\n', True, "not both"),
        ('[database]\nurl_file = "{d}/missing"\n', False, "cannot read"),
        (
            f'[[telegram]]\nname = "support"\ntoken = "{TOKEN}"\ntoken_file = "{{f}}"\n',
            True,
            "not both",
        ),
        (
            '[database]\nurl = "postgresql+asyncpg://bot:one@db/bot"\npassword_file = "{f}"\n',
            True,
            "another password",
        ),
    ],
)
def test_refusals_name_the_key_never_the_secret(
    tmp_path: Path, document: str, files: bool, reason: str
) -> None:
    secret = write(tmp_path / "secret", "SWORDFISH-42")
    with pytest.raises(ConfigError) as refused:
        load_settings(config(tmp_path, document.format(f=secret, d=tmp_path)))
    assert reason in str(refused.value)
    assert "SWORDFISH" not in str(refused.value)


def test_a_value_and_a_file_in_the_environment_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOT_ENGINE__API_KEY", "a")
    monkeypatch.setenv("BOT_ENGINE__API_KEY_FILE", str(write(tmp_path / "k", "b")))
    with pytest.raises(ConfigError, match="BOT_ENGINE__API_KEY_FILE are both set"):
        load_settings(None)


def test_scrubbing_removes_every_secret_variable_and_nothing_else() -> None:
    from bot.config import Settings

    environ = {
        "BOT_DATABASE__URL": "postgresql+asyncpg://bot:pw@db/bot",
        "BOT_DATABASE__PASSWORD_FILE": "/run/secrets/database.password",
        "BOT_ENGINE__API_KEY": "sk",
        "BOT_TENANCY__CACHE_SALT_SECRET": "salt",
        "BOT_ENGINE__MODEL": "data/smollm2",
        "BOT_CONFIG": "/etc/bot/bot.toml",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HOME": "/var/lib/bot",
    }
    removed = scrub_environment(Settings, environ)
    assert removed == [
        "BOT_DATABASE__PASSWORD_FILE",
        "BOT_DATABASE__URL",
        "BOT_ENGINE__API_KEY",
        "BOT_TENANCY__CACHE_SALT_SECRET",
    ]
    assert environ == {
        "BOT_ENGINE__MODEL": "data/smollm2",
        "BOT_CONFIG": "/etc/bot/bot.toml",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HOME": "/var/lib/bot",
    }
