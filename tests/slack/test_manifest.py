"""The Slack app manifest: Slack's schema fields, what the service serves, and the deploy copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.channels.slack import commands
from bot.channels.slack.manifest import BOT_SCOPES, app_manifest
from tests.ops.helpers import botctl
from tests.slack.manifest_fields import AppManifest

DEPLOY_COPY = Path(__file__).resolve().parents[2] / "deploy" / "slack-app-manifest.json"
PLACEHOLDER_URL = "https://bot.example.com"
README = Path(__file__).resolve().parents[2] / "README.md"
DEPLOY_README = DEPLOY_COPY.parent / "README.md"


def _unique(items: list[str]) -> bool:
    return len(items) == len(set(items))


@pytest.mark.parametrize("channels", ["mention", "all"])
def test_the_manifest_has_only_slack_schema_fields(channels: str) -> None:
    document = app_manifest("https://bot.example.com/", channels=channels)  # type: ignore[arg-type]
    parsed = AppManifest.model_validate(document)
    assert parsed.settings is not None and parsed.settings.event_subscriptions is not None
    events = parsed.settings.event_subscriptions.bot_events or []
    assert _unique(events) and "message.im" in events
    assert parsed.oauth_config is not None and parsed.oauth_config.scopes is not None
    assert _unique(parsed.oauth_config.scopes.bot or [])


def test_the_fields_model_refuses_what_slack_refuses() -> None:
    good = app_manifest(PLACEHOLDER_URL)
    for broken in (
        {**good, "colour": "blue"},  # an unknown top-level key
        {**good, "display_information": {"name": "x" * 36}},  # name over 35 characters
        {
            **good,
            "features": {"slash_commands": [{"command": "new", "description": "no slash"}]},
        },
        {**good, "settings": {"event_subscriptions": {"request_url": "bot.example.com/x"}}},
    ):
        with pytest.raises(ValidationError):
            AppManifest.model_validate(broken)


def test_every_url_points_at_the_service_routes() -> None:
    document = app_manifest(PLACEHOLDER_URL)
    events = document["settings"]["event_subscriptions"]
    assert events["request_url"] == f"{PLACEHOLDER_URL}/slack/events"
    urls = {command["url"] for command in document["features"]["slash_commands"]}
    assert urls == {f"{PLACEHOLDER_URL}/slack/commands"}
    # DMs need the App Home's messages tab, and the bot scopes include what each event needs.
    assert document["features"]["app_home"]["messages_tab_enabled"] is True
    assert {"app_mentions:read", "im:history", "commands", "chat:write"} <= set(BOT_SCOPES)


def test_the_manifest_offers_exactly_the_commands_the_service_answers() -> None:
    offered = {
        entry["command"] for entry in app_manifest(PLACEHOLDER_URL)["features"]["slash_commands"]
    }
    assert offered == set(commands._KNOWN)


async def test_botctl_prints_the_deploy_copy_for_its_url() -> None:
    printed = await botctl("slack", "manifest", "--url", PLACEHOLDER_URL, env={"BOT_CONFIG": ""})
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout) == app_manifest(PLACEHOLDER_URL)
    assert DEPLOY_COPY.read_text(encoding="utf-8") == printed.stdout


async def test_botctl_refuses_a_url_slack_cannot_call() -> None:
    for url in ("http://bot.example.com", "bot.example.com"):
        refused = await botctl("slack", "manifest", "--url", url, env={"BOT_CONFIG": ""})
        assert refused.exit_code == 2 and "https://" in refused.output
    missing = await botctl("slack", "manifest", env={"BOT_CONFIG": ""})
    assert missing.exit_code == 2 and "--url" in missing.output


def test_both_readmes_name_the_same_slack_commands() -> None:
    for readme in (README, DEPLOY_README):
        text = readme.read_text(encoding="utf-8")
        for command in commands._KNOWN:
            assert f"`{command}`" in text, f"{readme.name} does not name {command}"
