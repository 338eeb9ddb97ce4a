"""The fields of Slack's app manifest (schema version 1), as strict models, for the tests.

Written from Slack's published manifest schema (slackapi/manifest-schema,
``schemas/manifest.schema.1.0.0.json``): every object refuses unknown keys, and
each field carries the schema's type, required keys, lengths and patterns. Only
the parts an ordinary app uses are modelled; a manifest using another part fails
here as unknown, which is the point.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

HttpUrl = Annotated[str, StringConstraints(pattern=r"^https?://", max_length=3500)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Metadata(_Strict):
    major_version: int | None = None
    minor_version: int | None = None


class DisplayInformation(_Strict):
    name: Annotated[str, StringConstraints(min_length=1, max_length=35)]
    description: Annotated[str, StringConstraints(min_length=1, max_length=140)] | None = None
    background_color: (
        Annotated[str, StringConstraints(pattern=r"^#[0-9a-fA-F]{3}([0-9a-fA-F]{3})?$")] | None
    ) = None
    long_description: Annotated[str, StringConstraints(min_length=175, max_length=4000)] | None = (
        None
    )


class AppHome(_Strict):
    home_tab_enabled: bool | None = None
    messages_tab_enabled: bool | None = None
    messages_tab_read_only_enabled: bool | None = None


class BotUser(_Strict):
    display_name: Annotated[str, StringConstraints(min_length=1, max_length=80)]
    always_online: bool | None = None


class SlashCommand(_Strict):
    command: Annotated[str, StringConstraints(min_length=2, max_length=32, pattern=r"^/")]
    description: Annotated[str, StringConstraints(min_length=1, max_length=2000)]
    url: Annotated[str, StringConstraints(pattern=r"^https?://", max_length=3000)] | None = None
    usage_hint: Annotated[str, StringConstraints(min_length=1, max_length=1000)] | None = None
    should_escape: bool | None = None


class Features(_Strict):
    app_home: AppHome | None = None
    bot_user: BotUser | None = None
    slash_commands: Annotated[list[SlashCommand], Field(min_length=1, max_length=50)] | None = None


Scope = Annotated[str, StringConstraints(max_length=50)]


class Scopes(_Strict):
    user: Annotated[list[Scope], Field(max_length=255)] | None = None
    bot: Annotated[list[Scope], Field(max_length=255)] | None = None


class OAuthConfig(_Strict):
    redirect_urls: list[Annotated[str, StringConstraints(max_length=2500)]] | None = None
    scopes: Scopes | None = None
    token_management_enabled: bool | None = None


EventName = Annotated[str, StringConstraints(max_length=50)]


class EventSubscriptions(_Strict):
    request_url: HttpUrl | None = None
    user_events: Annotated[list[EventName], Field(max_length=100)] | None = None
    bot_events: Annotated[list[EventName], Field(max_length=100)] | None = None


class Interactivity(_Strict):
    is_enabled: bool
    request_url: HttpUrl | None = None
    message_menu_options_url: HttpUrl | None = None


class Settings(_Strict):
    event_subscriptions: EventSubscriptions | None = None
    interactivity: Interactivity | None = None
    org_deploy_enabled: bool | None = None
    socket_mode_enabled: bool | None = None
    is_hosted: bool | None = None
    token_rotation_enabled: bool | None = None


class AppManifest(_Strict):
    metadata: Metadata | None = Field(default=None, alias="_metadata")
    display_information: DisplayInformation
    features: Features | None = None
    oauth_config: OAuthConfig | None = None
    settings: Settings | None = None
