"""Tenant isolation in the KV cache: one vLLM ``cache_salt`` per tenant.

vLLM mixes the salt into the hash of a prompt's first block, so every block
hash after it differs too: prompts with different salts never share KV
blocks, while all conversations of one tenant (one salt) still do. Without
salts, a tenant could time its requests to learn whether another tenant
recently sent a given prefix (a cache-timing side channel).

The salt is ``HMAC-SHA256(secret, owner)``, not the owner itself: salts travel
to remote engines and their logs, and a guessable salt would let anyone who
can send salted requests to the same engine probe a tenant's cache. The
secret comes from ``tenancy.cache_salt_secret`` and is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import structlog

from bot.turns.settings import TenancySettings

log = structlog.get_logger(__name__)

SALT_HEX_CHARS = 32  # 128 bits: collision-free for any realistic number of tenants

# One random fallback secret per process, so every app built in it agrees (tests, one worker).
_PROCESS_SECRET = secrets.token_bytes(32)


class CacheSalts:
    def __init__(self, settings: TenancySettings) -> None:
        self._enabled = settings.isolate_cache
        configured = settings.cache_salt_secret
        if configured is not None and configured.get_secret_value():
            self._key = configured.get_secret_value().encode()
        else:
            self._key = _PROCESS_SECRET
            if self._enabled:
                log.warning(
                    "cache_salt_secret_unset",
                    hint="set tenancy.cache_salt_secret so that every worker gives a tenant the "
                    "same salt; with a per-process secret, a conversation that moves to another "
                    "worker misses the cache once",
                )

    def salt_for(self, owner: str) -> str | None:
        """The tenant's cache salt; None when isolation is off (every tenant shares blocks)."""
        if not self._enabled:
            return None
        digest = hmac.new(self._key, owner.encode(), hashlib.sha256).hexdigest()
        return digest[:SALT_HEX_CHARS]
