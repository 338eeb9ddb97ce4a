"""Tenant isolation: each tenant's prompts carry its own cache_salt, so no KV block is shared."""

from __future__ import annotations

from typing import Any

import structlog
from pydantic import SecretStr

from bot.engine.vllm_local import LocalVLLMEngine
from bot.turns.settings import TenancySettings
from bot.turns.tenancy import CacheSalts
from tests.conftest import MakeClient, issue_key
from tests.engine_spy import RecordingEngine
from tests.helpers import auth, read_sse

# Long enough for several full 32-token blocks after the system prompt.
PROMPT = (
    "Please summarise the quarterly figures for the northern region: revenue, costs, "
    "head count, open positions, churn and the three largest customers, in a table."
)


async def _ask(client: Any, key: str, conversation: str) -> dict[str, Any]:
    response = await client.post(
        "/v1/messages",
        json={"conversation_id": conversation, "message_id": "m1", "text": PROMPT},
        headers={**auth(key), "Accept": "text/event-stream"},
    )
    events = await read_sse(response)
    assert events[-1].kind == "done", events[-1]
    usage: dict[str, Any] = events[-1].data["usage"]
    return usage


async def test_the_same_prompt_is_cached_within_a_tenant_and_never_across(
    sqlite_url: str, make_client: MakeClient, engine: LocalVLLMEngine
) -> None:
    spy = RecordingEngine(engine)
    client = await make_client(
        sqlite_url, engine_override=spy, tenancy={"cache_salt_secret": "test-secret-1"}
    )
    acme = await issue_key(sqlite_url, "acme-key", owner="acme-tenancy-test")
    globex = await issue_key(sqlite_url, "globex-key", owner="globex-tenancy-test")

    first = await _ask(client, acme, "c1")
    assert first["prompt_tokens"] >= 64
    other_tenant = await _ask(client, globex, "c1")
    same_tenant = await _ask(client, acme, "c2")

    assert other_tenant["cached_tokens"] == 0
    assert same_tenant["cached_tokens"] >= 32
    salts = [call.request.cache_salt for call in spy.calls]
    assert salts[0] == salts[2] and salts[0] != salts[1] and all(salts)


async def test_without_isolation_tenants_share_blocks(
    sqlite_url: str, make_client: MakeClient
) -> None:
    """The control: the test above would fail without salts."""
    client = await make_client(sqlite_url, tenancy={"isolate_cache": False})
    initech = await issue_key(sqlite_url, "a", owner="initech-shared-test")
    hooli = await issue_key(sqlite_url, "b", owner="hooli-shared-test")
    await _ask(client, initech, "c")
    assert (await _ask(client, hooli, "c"))["cached_tokens"] >= 32


def test_salts_are_keyed_hashes_and_the_secret_is_never_logged() -> None:
    secret = "s3cr3t-value-for-the-test"
    with structlog.testing.capture_logs() as logs:
        salts = CacheSalts(TenancySettings(cache_salt_secret=SecretStr(secret)))
        again = CacheSalts(TenancySettings(cache_salt_secret=SecretStr(secret)))
        other = CacheSalts(TenancySettings(cache_salt_secret=SecretStr("another")))
    assert salts.salt_for("acme") == again.salt_for("acme")  # every worker agrees
    assert salts.salt_for("acme") != salts.salt_for("globex")
    assert salts.salt_for("acme") != other.salt_for("acme")
    assert "acme" not in (salts.salt_for("acme") or "")
    assert secret not in repr(logs)
    assert CacheSalts(TenancySettings(isolate_cache=False)).salt_for("acme") is None
